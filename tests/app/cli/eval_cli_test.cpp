// `vlmtrain eval` end to end on an HF directory the test writes (config.json, fp32
// safetensors, tokenizer.json): the output files exist and parse, `vlmtrain score` on
// predictions.jsonl gives the numbers of eval_summary.json, the predictions equal the
// evaluator library's on the same weights, two processes under a torchrun-like
// environment write the same predictions as one, and --checkpoint names a directory that is not a checkpoint.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <thread>

#include "app/eval/evaluator.h"
#include "app/config/model_source.h"
#include "tests/app/eval/eval_fixture.h"
#include "tests/dist_testing.h"
#include "vlm/io/hf_checkpoint.h"

namespace {

using nlohmann::json;

class EvalCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<vlm::test::TempDir>("eval_cli");
    const std::string d = dir_->path();
    vlm::test::write_file(d + "/tokenizer.json", vlm::test::tiny_tokenizer_json());
    vlm::test::write_eval_sets(d, 5);
    auto tok = vlm::test::tiny_tokenizer();
    auto model = vlm::test::tiny_eval_model(*tok, 11);
    vlm::SaveHfOptions so;
    so.dtype = torch::kFloat32;
    so.extra_files = {{"config.json", vlm::to_hf_json(model->cfg).dump(2)},
                      {"tokenizer.json", vlm::test::tiny_tokenizer_json()}};
    vlm::save_hf_checkpoint(d + "/hf", vlm::module_state(*model), so);
    // The recipe names another model and a tokenizer that does not exist: --model wins.
    vlm::test::write_file(d + "/r.toml",
                        "[run]\noutput_dir = \"" + d + "/run\"\n"
                        "[model]\npreset = \"tiny\"\ntokenizer = \"" + d + "/missing.json\"\n"
                        "[data]\neval = [\"" + d + "/lines.jsonl\", \"" + d + "/chat.jsonl\"]\n"
                        "prompt = \"Read the text.\"\nmax_image_tokens = 16\nnum_workers = 1\n"
                        "[eval]\nmax_new_tokens = 5\nbatch_size = 2\n");
  }

  std::vector<std::string> eval_argv(const std::string& out) {
    return {vlm::test::vlmtrain_bin(), "eval", *dir_ / "r.toml", "--model", *dir_ / "hf", "--out", out,
            "--batch-size", "3", "--set", "eval.case_sensitive=false"};
  }

  std::unique_ptr<vlm::test::TempDir> dir_;
};

TEST_F(EvalCli, HfDirEndToEndAgreesWithScoreAndTheLibrary) {
  const std::string out = *dir_ / "out";
  auto r = vlm::test::run(eval_argv(out), std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("overall"), std::string::npos) << r.output;
  const std::string pred_text = vlm::test::read_file(out + "/predictions.jsonl");
  const json sum = json::parse(vlm::test::read_file(out + "/eval_summary.json"));
  size_t lines = 0;
  for (size_t p = 0; (p = pred_text.find('\n', p)) != std::string::npos; ++p) ++lines;
  EXPECT_EQ(lines, 8u);
  EXPECT_EQ(sum["samples"], 8);
  EXPECT_EQ(sum["normalization"]["case_sensitive"], false);
  EXPECT_NE(sum["model"].get<std::string>().find(*dir_ / "hf"), std::string::npos) << sum["model"];

  // `vlmtrain score` with the same normalisation: the same numbers, per set and overall.
  auto s = vlm::test::run({vlm::test::vlmtrain_bin(), "score", "--pred", out + "/predictions.jsonl",
                         "--case-insensitive", "--out", *dir_ / "score.json"});
  ASSERT_EQ(s.exit_code, 0) << s.output;
  const json score = json::parse(vlm::test::read_file(*dir_ / "score.json"));
  EXPECT_EQ(score["skipped"], 0);
  auto same = [&](const json& got, const json& want, const std::string& what) {
    ASSERT_TRUE(want.is_object()) << what;
    for (const auto& [k, v] : want.items()) EXPECT_EQ(got[k], v) << what << " " << k;
  };
  same(sum["overall"], score["overall"], "overall");
  ASSERT_EQ(score["datasets"].size(), 2u);
  for (const auto& [name, j] : score["datasets"].items()) same(sum["datasets"][name], j, name);

  // The library on the same directory (as the trainer would call it) predicts the same.
  vlm::app::Recipe recipe = vlm::app::load_recipe(*dir_ / "r.toml", {"eval.case_sensitive=false"});
  vlm::app::ModelSection ms;
  ms.path = *dir_ / "hf";
  auto lm = vlm::app::load_model(ms, {});
  auto sets = vlm::app::load_eval_datasets(recipe, recipe.data.eval);
  vlm::app::EvalOptions o = vlm::app::eval_options(recipe);
  o.output_dir = *dir_ / "lib";
  o.batch_size = 1;
  vlm::app::evaluate(*lm.model, *lm.tokenizer, recipe, sets, o);
  EXPECT_EQ(vlm::test::read_file(o.output_dir + "/predictions.jsonl"), pred_text);
}

TEST_F(EvalCli, TwoProcessesWriteWhatOneWrites) {
  auto one = vlm::test::run(eval_argv(*dir_ / "one"), std::chrono::seconds(120));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::string port = std::to_string(vlm::test::free_port());
  std::vector<vlm::test::RunResult> res(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank)
    threads.emplace_back([&, rank] {
      res[size_t(rank)] = vlm::test::run(
          eval_argv(*dir_ / "two"), std::chrono::seconds(120),
          {"RANK=" + std::to_string(rank), "LOCAL_RANK=" + std::to_string(rank), "WORLD_SIZE=2",
           "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "OMP_NUM_THREADS=1"});
    });
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) ASSERT_EQ(res[size_t(rank)].exit_code, 0) << res[size_t(rank)].output;
  EXPECT_EQ(vlm::test::read_file(*dir_ / "two/predictions.jsonl"),
            vlm::test::read_file(*dir_ / "one/predictions.jsonl"));
  const json sum = json::parse(vlm::test::read_file(*dir_ / "two/eval_summary.json"));
  EXPECT_EQ(sum["world_size"], 2);
  EXPECT_EQ(sum["overall"], json::parse(vlm::test::read_file(*dir_ / "one/eval_summary.json"))["overall"]);
}

// Generation settings: the model directory's generation_config.json is read, eval.* keys
// (here through --set) win over it key by key, HF's defaults fill the rest, and
// eval_summary.json records the values used and where each came from. The penalty is
// applied: a huge one changes the predictions of a random model, whose greedy outputs
// repeat tokens.
TEST_F(EvalCli, GenerationConfigIsReadAndSetOverridesIt) {
  vlm::test::write_file(*dir_ / "hf/generation_config.json",
                      R"({"do_sample": false, "top_k": 1, "top_p": 0.001, "temperature": 0.01,
                          "repetition_penalty": 1.0, "eos_token_id": [7, 9], "pad_token_id": 3})");
  auto plain = vlm::test::run(eval_argv(*dir_ / "plain"), std::chrono::seconds(120));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const json g0 = json::parse(vlm::test::read_file(*dir_ / "plain/eval_summary.json"))["generation"];
  const std::string file = *dir_ / "hf/generation_config.json";
  EXPECT_EQ(g0["repetition_penalty"], 1.0);
  EXPECT_EQ(g0["origin"]["repetition_penalty"], file);
  EXPECT_EQ(g0["top_k"], 1);
  EXPECT_EQ(g0["do_sample"], false);
  EXPECT_EQ(g0["eos_token_id"], json::array({7, 9}));
  EXPECT_EQ(g0["pad_token_id"], 3);
  for (int64_t id : {7, 9})
    EXPECT_NE(std::find(g0["stop_tokens"].begin(), g0["stop_tokens"].end(), id), g0["stop_tokens"].end());
  EXPECT_NE(plain.output.find("eval generation: greedy"), std::string::npos) << plain.output;

  auto argv = eval_argv(*dir_ / "penalty");
  argv.insert(argv.end(), {"--set", "eval.repetition_penalty=1000000.0", "--set", "eval.top_k=5"});
  auto pen = vlm::test::run(argv, std::chrono::seconds(120));
  ASSERT_EQ(pen.exit_code, 0) << pen.output;
  const json g1 = json::parse(vlm::test::read_file(*dir_ / "penalty/eval_summary.json"))["generation"];
  EXPECT_EQ(g1["repetition_penalty"], 1e6);
  EXPECT_EQ(g1["origin"]["repetition_penalty"], "recipe");
  EXPECT_EQ(g1["top_k"], 5);
  EXPECT_EQ(g1["origin"]["top_k"], "recipe");
  EXPECT_EQ(g1["top_p"], 0.001);  // still the file's
  EXPECT_EQ(g1["origin"]["top_p"], file);
  EXPECT_NE(pen.output.find("repetition_penalty 1e+06 (recipe)"), std::string::npos) << pen.output;
  // The penalty reached the decoder: the predictions change.
  EXPECT_NE(vlm::test::read_file(*dir_ / "penalty/predictions.jsonl"),
            vlm::test::read_file(*dir_ / "plain/predictions.jsonl"));

  // No file: HF's defaults, said so.
  std::filesystem::remove(*dir_ / "hf/generation_config.json");
  auto none = vlm::test::run(eval_argv(*dir_ / "none"), std::chrono::seconds(120));
  ASSERT_EQ(none.exit_code, 0) << none.output;
  const json g2 = json::parse(vlm::test::read_file(*dir_ / "none/eval_summary.json"))["generation"];
  EXPECT_EQ(g2["origin"]["repetition_penalty"], "default");
  EXPECT_EQ(g2["repetition_penalty"], 1.0);
  EXPECT_EQ(g2["do_sample"], false);
  EXPECT_EQ(g2["eos_token_id"], json::array());
}

// (--checkpoint on a real training checkpoint: tests/app/train/train_resume_dist_test.cpp.)
TEST_F(EvalCli, CheckpointThatIsNotOneIsNamed) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "eval", *dir_ / "r.toml", "--checkpoint", *dir_ / "hf"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is neither a checkpoint nor a run directory"), std::string::npos) << r.output;
}

TEST_F(EvalCli, DefaultOutputIsUnderTheRunDirectory) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "eval", *dir_ / "r.toml", "--model", *dir_ / "hf",
                         "--max-samples", "1", "--data", *dir_ / "chat.jsonl"},
                        std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json sum = json::parse(vlm::test::read_file(*dir_ / "run/eval/eval_summary.json"));
  EXPECT_EQ(sum["samples"], 1);
  EXPECT_EQ(sum["datasets"].size(), 1u);
  EXPECT_TRUE(sum["datasets"].contains("chat"));
}

}  // namespace
