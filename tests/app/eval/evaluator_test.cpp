// The evaluator against independent references, in one process:
//   - every prediction equals a plain generate() call on that sample alone (no padding),
//     for batch sizes 1 and 3 (left padding must not change a thing) and in lockstep mode
//     (dummy image for text-only prompts, filler-free at world 1);
//   - the summary equals app/metrics' Scorer run over predictions.jsonl as a reader would;
//   - max_samples takes the first N records of each set;
//   - an image that fails to decode is reported by file:line and skipped, or is an error,
//     as data.max_bad_fraction says;
//   - the model's train/eval mode and parameters are untouched, no gradient is recorded.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <set>

#include "app/eval/evaluator.h"
#include "app/eval/metrics.h"
#include "data/loader.h"
#include "data/sample_builder.h"
#include "tests/app/eval/eval_fixture.h"
#include "vlm/runtime/check.h"
#include "vlm/model/generation.h"

namespace {

using nlohmann::json;

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

class Evaluator : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new vlm::test::TempDir("evaluator");
    vlm::test::write_file(*dir_ / "tokenizer.json", vlm::test::tiny_tokenizer_json());
    vlm::test::write_eval_sets(dir_->path());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    tok_ = vlm::test::tiny_tokenizer();
    model_ = vlm::test::tiny_eval_model(*tok_);
    recipe_ = vlm::test::eval_recipe(dir_->path());
    sets_ = vlm::app::load_eval_datasets(recipe_, recipe_.data.eval);
  }

  vlm::app::EvalOptions options(const std::string& out = "") {
    vlm::app::EvalOptions o = vlm::app::eval_options(recipe_);
    o.output_dir = out;
    return o;
  }

  // The reference: the record's prompt alone (no padding, no batching), generate(), decode.
  std::string reference_prediction(const vlm::data::Record& rec, int64_t max_new_tokens) {
    vlm::data::PixelConfig px;  // the tiny Qwen2-VL model's processor: Qwen2-VL's defaults
    px.max_image_tokens = recipe_.data.max_image_tokens;
    auto images = vlm::data::load_record_images(rec, px);
    auto prompt = vlm::data::build_generation_prompt(*tok_, rec, images, {}, 0).sample;
    vlm::Batch b;
    b.input_ids = torch::tensor(prompt.input_ids, torch::kLong).view({1, -1});
    if (prompt.pixel_values.defined()) {
      b.pixel_values = prompt.pixel_values;
      std::vector<int64_t> g;
      for (const auto& t : prompt.grid_thw) g.insert(g.end(), t.begin(), t.end());
      b.image_grid_thw = torch::tensor(g, torch::kLong).view({-1, 3});
    }
    vlm::GenerationOptions o;
    o.max_new_tokens = max_new_tokens;
    const int64_t im_end = tok_->special_id("<|im_end|>"), eot = tok_->special_id("<|endoftext|>");
    o.stop_tokens = {im_end, eot};
    auto ids = vlm::generate(*model_, b, o).tokens[0];
    if (!ids.empty() && (ids.back() == im_end || ids.back() == eot)) ids.pop_back();
    return tok_->decode(ids, /*skip_special=*/true);
  }

  static vlm::test::TempDir* dir_;
  std::unique_ptr<vlm::Tokenizer> tok_;
  vlm::VisionLanguageModel model_{nullptr};
  vlm::app::Recipe recipe_;
  std::vector<vlm::app::EvalDataset> sets_;
};
vlm::test::TempDir* Evaluator::dir_ = nullptr;

TEST_F(Evaluator, PredictionsEqualPerSampleGenerateForBatchSizes1And3) {
  ASSERT_EQ(sets_.size(), 2u);
  EXPECT_EQ(sets_[0].name, "lines");
  EXPECT_EQ(sets_[1].name, "chat");
  std::map<std::string, std::vector<json>> runs;
  for (int64_t bs : {1, 3}) {
    vlm::app::EvalOptions o = options(*dir_ / ("bs" + std::to_string(bs)));
    o.batch_size = bs;
    vlm::app::EvalSummary s = vlm::app::evaluate(*model_, *tok_, recipe_, sets_, o);
    EXPECT_EQ(s.samples, 10);
    EXPECT_EQ(s.skipped, 0);
    runs[std::to_string(bs)] = read_jsonl(o.output_dir + "/predictions.jsonl");
  }
  {
    vlm::app::EvalOptions o = options(*dir_ / "lockstep");
    o.lockstep = true;  // world 1: dummy image for the text-only prompt, no filler
    vlm::app::evaluate(*model_, *tok_, recipe_, sets_, o);
    runs["lockstep"] = read_jsonl(o.output_dir + "/predictions.jsonl");
  }
  const auto& lines = runs["1"];
  ASSERT_EQ(lines.size(), 10u);
  std::set<std::string> distinct;
  size_t k = 0;
  for (const auto& set : sets_) {
    for (size_t r = 0; r < set.records.size(); ++r, ++k) {
      const std::string want = reference_prediction(set.records[r], 6);
      distinct.insert(want);
      for (const auto& [name, run] : runs) {
        ASSERT_EQ(run.size(), 10u) << name;
        EXPECT_EQ(run[k]["id"], set.records[r].location()) << name;
        EXPECT_EQ(run[k]["dataset"], set.name) << name;
        EXPECT_EQ(run[k]["index"], r) << name;
        EXPECT_EQ(run[k]["prediction"], want) << name << " " << set.records[r].location();
      }
    }
  }
  std::string all;
  for (const auto& d : distinct) all += "[" + d + "] ";
  EXPECT_GT(distinct.size(), 3u) << "the random model should not answer everything alike: " << all;
  EXPECT_EQ(lines[2]["answers"], json({"abab", "ab ab"}));
  EXPECT_EQ(lines[9]["answers"], json({"12"}));
  EXPECT_EQ(lines[0]["prompt"], "<image>Read the text.");
}

TEST_F(Evaluator, SummaryEqualsScorerOverPredictionsFile) {
  vlm::app::EvalOptions o = options(*dir_ / "summary");
  o.score.norm.case_sensitive = false;
  o.score.metrics = {"cer", "wer", "em", "anls"};
  vlm::app::EvalSummary s = vlm::app::evaluate(*model_, *tok_, recipe_, sets_, o);
  const json file = json::parse(vlm::test::read_file(o.output_dir + "/eval_summary.json"));
  EXPECT_EQ(file, s.json);
  EXPECT_EQ(file["normalization"], o.score.norm.to_json());
  EXPECT_EQ(file["metrics"], json(o.score.metrics));

  // Independent: score the written file line by line.
  vlm::app::Scorer overall(o.score);
  std::map<std::string, vlm::app::Scorer> per_set;
  for (const json& line : read_jsonl(o.output_dir + "/predictions.jsonl")) {
    auto refs = line["answers"].get<std::vector<std::string>>();
    auto pred = line["prediction"].get<std::string>();
    overall.add(pred, refs);
    per_set.try_emplace(line["dataset"].get<std::string>(), o.score).first->second.add(pred, refs);
  }
  auto expect_same = [&](const json& got, const vlm::app::Scorer& sc, const std::string& prefix) {
    const json want = vlm::app::summary_json(sc.summary(), o.score);
    for (const auto& [key, v] : want.items()) EXPECT_EQ(got[key], v) << prefix << " " << key;
    for (const std::string& m : o.score.metrics) {
      if (want[m].is_null()) continue;
      EXPECT_DOUBLE_EQ(s.metrics.at("eval/" + prefix + "/" + m), want[m].get<double>()) << prefix << m;
    }
    EXPECT_EQ(s.metrics.at("eval/" + prefix + "/n"), double(sc.size()));
  };
  expect_same(file["overall"], overall, "overall");
  ASSERT_EQ(per_set.size(), 2u);
  for (const auto& [name, sc] : per_set) expect_same(file["datasets"][name], sc, name);
  EXPECT_EQ(s.metrics.count("eval/overall/ned"), 0u) << "ned not enabled";
  EXPECT_EQ(file["samples"], 10);
}

TEST_F(Evaluator, MaxSamplesTakesTheFirstRecordsOfEachSet) {
  vlm::app::EvalOptions o = options(*dir_ / "max2");
  o.max_samples = 2;
  vlm::app::EvalSummary s = vlm::app::evaluate(*model_, *tok_, recipe_, sets_, o);
  const auto lines = read_jsonl(o.output_dir + "/predictions.jsonl");
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(s.samples, 4);
  const std::vector<std::pair<std::string, int>> want = {{"lines", 0}, {"lines", 1}, {"chat", 0}, {"chat", 1}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(lines[i]["dataset"], want[i].first);
    EXPECT_EQ(lines[i]["index"], want[i].second);
  }
  EXPECT_EQ(s.json["datasets"]["lines"]["n"], 2);
  EXPECT_EQ(s.metrics.at("eval/chat/n"), 2.0);
  EXPECT_EQ(s.json["max_samples"], 2);
}

TEST_F(Evaluator, CorruptImageIsSkippedOrFailsByMaxBadFraction) {
  // A PNG whose header is intact (the dataset's probe accepts it) but whose data is cut off.
  const std::string good = vlm::test::read_file(*dir_ / "l3.png");
  vlm::test::write_file(*dir_ / "broken.png", good.substr(0, 60));
  vlm::test::write_file(*dir_ / "with_broken.jsonl",
                      R"({"image":"l0.png","text":"hello"})" "\n"
                      R"({"image":"broken.png","text":"world"})" "\n"
                      R"({"image":"l1.png","text":"the"})" "\n");
  recipe_.data.max_bad_fraction = 0.5;
  auto sets = vlm::app::load_eval_datasets(recipe_, {*dir_ / "with_broken.jsonl"});
  ASSERT_EQ(sets.size(), 1u);
  ASSERT_EQ(sets[0].records.size(), 3u) << "the header probe must accept the file";
  EXPECT_EQ(sets[0].bad_at_load, 0);

  vlm::app::EvalOptions o = options(*dir_ / "broken");
  EXPECT_EQ(o.max_bad_fraction, 0.5);
  o.batch_size = 3;
  vlm::app::EvalSummary s = vlm::app::evaluate(*model_, *tok_, recipe_, sets, o);
  EXPECT_EQ(s.samples, 2);
  EXPECT_EQ(s.skipped, 1);
  ASSERT_EQ(s.json["skipped"].size(), 1u);
  const json& sk = s.json["skipped"][0];
  EXPECT_EQ(sk["id"], sets[0].records[1].location());
  EXPECT_NE(sk["reason"].get<std::string>().find("broken.png"), std::string::npos) << sk;
  EXPECT_EQ(s.json["datasets"]["with_broken"]["skipped"], 1);
  const auto lines = read_jsonl(o.output_dir + "/predictions.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1]["index"], 2);
  EXPECT_EQ(lines[1]["prediction"], reference_prediction(sets[0].records[2], 6));

  o.max_bad_fraction = 0.2;  // 1 of 3 is too many
  try {
    vlm::app::evaluate(*model_, *tok_, recipe_, sets, o);
    ADD_FAILURE() << "expected vlm::Error";
  } catch (const vlm::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("broken.png"), std::string::npos) << msg;
    EXPECT_NE(msg.find(sets[0].records[1].location()), std::string::npos) << msg;
    EXPECT_NE(msg.find("max_bad_fraction"), std::string::npos) << msg;
  }
}

TEST_F(Evaluator, LeavesTrainingStateAlone) {
  std::vector<torch::Tensor> before;
  for (const auto& p : model_->parameters()) before.push_back(p.detach().clone());
  for (bool training : {true, false}) {
    model_->train(training);
    vlm::app::EvalOptions o = options();
    o.max_samples = 1;
    vlm::app::evaluate(*model_, *tok_, recipe_, sets_, o);
    EXPECT_EQ(model_->is_training(), training);
  }
  size_t i = 0;
  for (const auto& p : model_->parameters()) {
    EXPECT_TRUE(torch::equal(p, before[i++]));
    EXPECT_FALSE(p.grad().defined());
  }
  EXPECT_FALSE(vlm::test::file_exists(*dir_ / "predictions.jsonl")) << "no output_dir: no files";
}

TEST_F(Evaluator, TokenizerThatDoesNotMatchTheModelIsAnError) {
  vlm::VlmConfig cfg = model_->cfg;
  cfg.image_token_id = 5;
  vlm::VisionLanguageModel other(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*other, {torch::kCPU, torch::kFloat32, 1});
  try {
    vlm::app::evaluate(*other, *tok_, recipe_, sets_, options());
    ADD_FAILURE() << "expected vlm::Error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("<|image_pad|>"), std::string::npos) << e.what();
  }
}

}  // namespace
