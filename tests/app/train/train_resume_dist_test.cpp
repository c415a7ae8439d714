// The trainer end to end through the vlmtrain binary (real processes, Gloo over loopback,
// hard timeouts): resume bit-exactness at the same world size, resume onto another world
// size, hybrid sharding on a 2 x 2 mesh, incomplete checkpoints ignored, export -> load
// round trip.
//
// References are the trainer's own uninterrupted runs: a resumed run must log exactly the
// losses the uninterrupted run logged for the same steps (same world size: bit for bit on
// CPU; another world size with the same global batch: within 1e-5 relative, the rounding
// of summing the same per-sample gradients in another order).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/train/checkpoint.h"
#include "tests/dist_testing.h"
#include "tests/app/train/train_testing.h"
#include "tests/testing.h"
#include "vlm/model/config.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/vision_language_model.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;

namespace {

// Synthetic OCR set + sentencepiece tokenizer shared by every test of this file.
TempDir* g_resume_data = nullptr;

class TrainResume : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_resume_data = new TempDir("train-data");
    vlm::test::make_synth_data(g_resume_data->path(), 64, 5);
  }
  static void TearDownTestSuite() {
    delete g_resume_data;
    g_resume_data = nullptr;
  }

  // A small recipe: tiny model, mixed policies, `steps` steps, checkpoints every 3.
  std::string recipe(const TempDir& dir, int samples_per_rank, int steps = 6) {
    const std::string path = dir / "recipe.toml";
    vlm::test::write_file(path, R"(
[run]
output_dir = ")" + (dir / "run") + R"("
seed = 3
[model]
preset = "tiny"
tokenizer = ")" + (*g_resume_data / "tokenizer.model") + R"("
[data]
train = [")" + (*g_resume_data / "train.jsonl") + R"("]
format = "ocr"
prompt = "Read the text."
max_image_tokens = 32
max_seq_len = 128
num_workers = 1
[batch]
samples_per_rank = )" + std::to_string(samples_per_rank) + R"(
max_tokens = 256
max_image_tokens = 256
[optim]
lr = 2e-3
weight_decay = 0.01
[schedule]
steps = )" + std::to_string(steps) + R"(
warmup_steps = 2
[sharding]
default = "ddp"
[[sharding.module]]
match = "visual.patch_embed|visual.blocks.*"
policy = "freeze"
[[sharding.module]]
match = "model.layers.*"
policy = "fsdp"
strategy = "full_shard"
[dist]
timeout_s = 60
[checkpoint]
every = 3
keep_last = 5
[eval]
at_end = false
[log]
every = 1
)");
    return path;
  }

  std::vector<vlm::test::WorkerResult> train(int world, const std::string& recipe_path,
                                           const std::vector<std::string>& sets = {},
                                           const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {vlm::test::vlmtrain_bin(), "train", recipe_path};
    for (const auto& s : sets) {
      argv.push_back("--set");
      argv.push_back(s);
    }
    return vlm::test::run_ranks(world, argv, std::chrono::seconds(240), env);
  }
};


// Copies a run directory keeping only metrics of steps <= `upto` and checkpoints <= `upto`.
void copy_run_until(const std::string& from, const std::string& to, int64_t upto) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0) {
      if (std::stoll(name.substr(5)) <= upto) fs::copy(e.path(), fs::path(to) / name, fs::copy_options::recursive);
    } else if (name == "metrics.jsonl") {
      std::ifstream in(e.path());
      std::ofstream out(fs::path(to) / name);
      std::string line;
      while (std::getline(in, line))
        if (nlohmann::json::parse(line).at("step").get<int64_t>() <= upto) out << line << "\n";
    }
  }
}

void expect_close(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want, int64_t from,
                  int64_t to, double rel) {
  for (int64_t s = from; s <= to; ++s) {
    ASSERT_TRUE(got.count(s) && want.count(s)) << "step " << s << " missing";
    if (rel == 0)
      EXPECT_EQ(got.at(s), want.at(s)) << "step " << s;
    else
      EXPECT_NEAR(got.at(s), want.at(s), rel * std::abs(want.at(s))) << "step " << s;
  }
}

TEST_F(TrainResume, SameWorldSizeIsBitExactAndIgnoresIncompleteCheckpoints) {
  for (int world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    TempDir dir("resume");
    const std::string rp = recipe(dir, 2);
    ASSERT_TRUE(vlm::test::all_ok(train(world, rp)));
    const auto full = vlm::test::losses_by_step(dir / "run");
    ASSERT_EQ(full.size(), 6u);
    EXPECT_LT(full.at(6), full.at(1));  // it trains
    // Interrupted after step 3 "while saving step 6": step-6 exists without COMPLETE.
    TempDir dir2("resume2");
    copy_run_until(dir / "run", dir2 / "run", 6);
    fs::remove(dir2 / "run/step-00000006/COMPLETE");
    {  // metrics of steps 4-6 were never written in the interrupted run
      copy_run_until(dir / "run", dir2 / "tmp", 3);
      fs::copy_file(dir2 / "tmp/metrics.jsonl", dir2 / "run/metrics.jsonl", fs::copy_options::overwrite_existing);
    }
    const std::string rp2 = recipe(dir2, 2);
    auto res = train(world, rp2);
    ASSERT_TRUE(vlm::test::all_ok(res));
    EXPECT_NE(res[0].output.find("resumed from " + (dir2 / "run/step-00000003")), std::string::npos) << res[0].output;
    expect_close(vlm::test::losses_by_step(dir2 / "run"), full, 1, 6, 0.0);
    EXPECT_TRUE(fs::exists(dir2 / "run/step-00000006/COMPLETE"));  // the leftover was replaced
  }
}

TEST_F(TrainResume, OntoAnotherWorldSizeKeepsTheLossCurve) {
  // (written by world, samples per rank) -> (resumed by world, samples per rank); global batch 4 or 6.
  struct Case {
    int w0, b0, w1, b1;
  };
  for (const Case& c : {Case{2, 2, 1, 4}, Case{1, 6, 3, 2}}) {
    SCOPED_TRACE("world " + std::to_string(c.w0) + " -> " + std::to_string(c.w1));
    TempDir dir("reshard");
    ASSERT_TRUE(vlm::test::all_ok(train(c.w0, recipe(dir, c.b0))));
    const auto full = vlm::test::losses_by_step(dir / "run");
    TempDir dir2("reshard2");
    copy_run_until(dir / "run", dir2 / "run", 3);
    auto res = train(c.w1, recipe(dir2, c.b1));
    ASSERT_TRUE(vlm::test::all_ok(res));
    EXPECT_NE(res[0].output.find("written by " + std::to_string(c.w0) + " rank(s), now " + std::to_string(c.w1)),
              std::string::npos)
        << res[0].output;
    expect_close(vlm::test::losses_by_step(dir2 / "run"), full, 4, 6, 1e-5);
  }
}

// Hybrid sharding through the binary: world 4 as a 2 x 2 mesh (dist.dp_shard = 2, the LLM
// layers hybrid_shard) follows the world-1 run of the same global batch, and its step-3
// checkpoint resumes at world 2 (full_shard, no mesh) on its own loss curve.
TEST_F(TrainResume, HybridTwoByTwoEqualsWorld1AndResumesAtWorld2) {
  TempDir dir("hybrid");
  const std::vector<std::string> hybrid = {"sharding.module.1.strategy=hybrid_shard", "dist.dp_shard=2"};
  auto res = train(4, recipe(dir, 1), hybrid);
  ASSERT_TRUE(vlm::test::all_ok(res));
  EXPECT_NE(res[0].output.find("mesh: dp_replicate 2 x dp_shard 2"), std::string::npos) << res[0].output;
  const auto full = vlm::test::losses_by_step(dir / "run");
  TempDir one("hybrid-w1");
  ASSERT_TRUE(vlm::test::all_ok(train(1, recipe(one, 4))));
  expect_close(full, vlm::test::losses_by_step(one / "run"), 1, 6, 1e-5);
  TempDir dir2("hybrid-resume");
  copy_run_until(dir / "run", dir2 / "run", 3);
  auto res2 = train(2, recipe(dir2, 2));
  ASSERT_TRUE(vlm::test::all_ok(res2));
  EXPECT_NE(res2[0].output.find("written by 4 rank(s), now 2"), std::string::npos) << res2[0].output;
  expect_close(vlm::test::losses_by_step(dir2 / "run"), full, 4, 6, 1e-5);
}

TEST_F(TrainResume, ExportLoadsBackToTheCheckpointTensors) {
  TempDir dir("export");
  ASSERT_TRUE(vlm::test::all_ok(train(2, recipe(dir, 2, 3))));
  const std::string ckpt = dir / "run/step-00000003";
  vlm::app::CheckpointReader reader(ckpt);
  const vlm::NamedTensors want = reader.consolidated();
  for (const std::string dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    const std::string out = dir / ("hf-" + dtype);
    auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", dir / "run", "--out", out, "--dtype", dtype});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(fs::exists(fs::path(out) / "tokenizer.model"));
    // Our own loader: build the model from the exported config and load the weights.
    vlm::VlmConfig cfg = vlm::load_hf_config(out);
    vlm::VisionLanguageModel model(cfg);
    if (dtype == "bf16") model->to(torch::kBFloat16);
    vlm::load_module_weights(*model, out);
    std::map<std::string, torch::Tensor> params;
    for (const auto& p : model->named_parameters()) params[p.key()] = p.value();
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(params.count(name)) << name;
      torch::Tensor expect = dtype == "bf16" ? t.to(torch::kBFloat16) : t;
      EXPECT_TRUE(torch::equal(params[name], expect)) << name;
    }
    EXPECT_EQ(params.size(), want.size());
  }
  // eval --checkpoint scores the checkpoint itself: the same predictions as its fp32 export.
  const std::string data = *g_resume_data / "val.jsonl";
  auto e1 = vlm::test::run({vlm::test::vlmtrain_bin(), "eval", recipe(dir, 2, 3), "--checkpoint", ckpt, "--data", data,
                          "--max-new-tokens", "6", "--out", dir / "eval-ckpt"});
  ASSERT_EQ(e1.exit_code, 0) << e1.output;
  auto e2 = vlm::test::run({vlm::test::vlmtrain_bin(), "eval", recipe(dir, 2, 3), "--model", dir / "hf-fp32", "--data",
                          data, "--max-new-tokens", "6", "--out", dir / "eval-hf"});
  ASSERT_EQ(e2.exit_code, 0) << e2.output;
  auto preds = [](const std::string& f) {
    std::vector<std::string> out;
    for (const auto& l : vlm::test::metrics_lines(f)) out.push_back(l.at("prediction").get<std::string>());
    return out;
  };
  EXPECT_EQ(preds(dir / "eval-ckpt/predictions.jsonl"), preds(dir / "eval-hf/predictions.jsonl"));
  EXPECT_EQ(preds(dir / "eval-ckpt/predictions.jsonl").size(), 4u);
  // A second export into the same directory needs --overwrite.
  auto again = vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", ckpt, "--out", dir / "hf-fp32"});
  EXPECT_NE(again.exit_code, 0);
}

}  // namespace
