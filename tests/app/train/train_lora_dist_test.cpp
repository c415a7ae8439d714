// LoRA end to end through the vlmtrain binary (real processes, Gloo over loopback, hard
// timeouts), tiny preset, fp32, dropout 0: adapters r = 4 on q/k/v/o and gate/up/down of
// every LLM layer with the frozen base FSDP-sharded (strategy = "full_shard"), the merger
// ddp, everything else frozen.
//   - world 2 equals world 1 at the same global batch (per-step losses, final adapters)
//   - the checkpoint holds the trainable state only (adapters, merger; no "/param" key)
//   - a run written at world 2 resumes at world 1 on the uninterrupted run's loss curve
//   - bad LoRA rules fail through the CLI with the recipe's file:line or the module's name
// References are the trainer's own runs (as train_resume_dist_test): another world size
// with the same global batch sums the same per-sample gradients in another order, so
// losses agree within 1e-5 relative, not bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "app/train/checkpoint.h"
#include "sharding/parallel/policy.h"
#include "tests/app/train/train_testing.h"
#include "tests/dist_testing.h"
#include "tests/testing.h"
#include "vlm/model/config.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/io/safetensors.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;

namespace {

constexpr int kLoraSteps = 6;
constexpr int64_t kLoraR = 4;
const char* const kLoraMatch = "model.layers.*.self_attn.*_proj|model.layers.*.mlp.*_proj";

// Synthetic OCR set + tokenizer, and the uninterrupted runs by world size (made on first use,
// shared by the tests of this file).
TempDir* g_lora_data = nullptr;
std::map<int, std::unique_ptr<TempDir>>* g_lora_runs = nullptr;

// The recipe of this file; `rules` replaces the [[sharding.module]] rows.
std::string lora_recipe(const TempDir& dir, int samples_per_rank, const std::string& rules = "") {
  const std::string path = dir / "recipe.toml";
  const std::string default_rules = std::string(R"(
[[sharding.module]]
match = "visual.merger"
policy = "ddp"
[[sharding.module]]
match = ")") + kLoraMatch + R"("
policy = "lora"
strategy = "full_shard"
r = )" + std::to_string(kLoraR) + R"(
alpha = 8
dropout = 0.0
)";
  vlm::test::write_file(path, R"(
[run]
output_dir = ")" + (dir / "run") + R"("
seed = 3
[model]
preset = "tiny"
tokenizer = ")" + (*g_lora_data / "tokenizer.model") + R"("
[data]
train = [")" + (*g_lora_data / "train.jsonl") + R"("]
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
lr = 5e-3
weight_decay = 0.01
[schedule]
steps = )" + std::to_string(kLoraSteps) + R"(
warmup_steps = 2
[precision]
param_dtype = "fp32"
reduce_dtype = "fp32"
[sharding]
default = "freeze"
)" + (rules.empty() ? default_rules : rules) + R"(
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

std::vector<vlm::test::WorkerResult> lora_train(int world, const std::string& recipe_path) {
  return vlm::test::run_ranks(world, {vlm::test::vlmtrain_bin(), "train", recipe_path}, std::chrono::seconds(240));
}

class TrainLoraDist : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_lora_data = new TempDir("lora-data");
    vlm::test::make_synth_data(g_lora_data->path(), 64, 7);
    g_lora_runs = new std::map<int, std::unique_ptr<TempDir>>();
  }
  static void TearDownTestSuite() {
    delete g_lora_runs;
    delete g_lora_data;
    g_lora_runs = nullptr;
    g_lora_data = nullptr;
  }

  // The uninterrupted run at `world` ranks, global batch 4 (4 / world samples per rank).
  static const TempDir& full_run(int world) {
    auto& slot = (*g_lora_runs)[world];
    if (!slot) {
      auto dir = std::make_unique<TempDir>("lora-w" + std::to_string(world));
      auto res = lora_train(world, lora_recipe(*dir, 4 / world));
      EXPECT_TRUE(vlm::test::all_ok(res));
      EXPECT_NE(res[0].output.find("+lora"), std::string::npos) << res[0].output;  // the unit table
      slot = std::move(dir);
    }
    return *slot;
  }
};

// The adapter tensors the recipe's lora rule must create, with their shapes, and the
// merger's parameters, from a tiny model built on the meta device (independent of the run).
std::map<std::string, std::vector<int64_t>> lora_expected_tensors() {
  const vlm::VlmConfig cfg = vlm::preset("tiny");
  vlm::VisionLanguageModel meta(cfg, torch::TensorOptions().device(torch::kMeta));
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& p : meta->named_parameters()) {
    const std::string& n = p.key();
    if (n.rfind("visual.merger.", 0) == 0) out[n] = p.value().sizes().vec();
    const bool proj = n.rfind("model.layers.", 0) == 0 && n.size() > 12 &&
                      n.compare(n.size() - 12, 12, "_proj.weight") == 0;
    if (!proj) continue;
    const std::string mod = n.substr(0, n.size() - 7);  // without ".weight"
    const int64_t out_f = p.value().size(0), in_f = p.value().size(1);
    out[mod + ".lora_A.weight"] = {kLoraR, in_f};
    out[mod + ".lora_B.weight"] = {out_f, kLoraR};
  }
  return out;
}

void lora_expect_losses_close(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want,
                              int64_t from, int64_t to, double rel) {
  double worst = 0;
  for (int64_t s = from; s <= to; ++s) {
    ASSERT_TRUE(got.count(s) && want.count(s)) << "step " << s << " missing";
    EXPECT_NEAR(got.at(s), want.at(s), rel * std::abs(want.at(s))) << "step " << s;
    worst = std::max(worst, std::abs(got.at(s) - want.at(s)) / std::abs(want.at(s)));
  }
  std::printf("losses of steps %lld..%lld: largest relative difference %.3g\n", static_cast<long long>(from),
              static_cast<long long>(to), worst);
}

// The line of `path` holding `needle` (1-based), 0 if none.
int lora_line_of(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (line.find(needle) != std::string::npos) return n;
  return 0;
}

TEST_F(TrainLoraDist, WorldTwoWithShardedBaseMatchesWorldOne) {
  const TempDir& w1 = full_run(1);
  const TempDir& w2 = full_run(2);
  const auto l1 = vlm::test::losses_by_step(w1 / "run");
  const auto l2 = vlm::test::losses_by_step(w2 / "run");
  ASSERT_EQ(l1.size(), static_cast<size_t>(kLoraSteps));
  EXPECT_LT(l1.at(kLoraSteps), l1.at(1));  // the adapters train
  lora_expect_losses_close(l2, l1, 1, kLoraSteps, 1e-5);

  // The final adapters and merger: fp32 masters after 6 AdamW steps from the same start.
  const vlm::NamedTensors a = vlm::app::CheckpointReader(w1 / "run/step-00000006").consolidated();
  const vlm::NamedTensors b = vlm::app::CheckpointReader(w2 / "run/step-00000006").consolidated();
  ASSERT_EQ(a.size(), b.size());
  // Tolerance: AdamW moves an element by about lr (peak 5e-3) per step whatever the size of
  // its gradient, so where a gradient element is near zero, summation-order rounding shows
  // as a visible difference in a few elements (observed: max 4.3e-5 in 243 of 472,064
  // elements above 1e-6; relative L2 per tensor <= 2e-5).
  double worst = 0, worst_rel = 0;
  int64_t moved_b = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    ASSERT_TRUE(a[i].second.sizes().equals(b[i].second.sizes())) << a[i].first;
    const torch::Tensor d = a[i].second - b[i].second;
    const double diff = d.abs().max().item<double>();
    const double rel = d.norm().item<double>() / std::max(1e-12, a[i].second.norm().item<double>());
    worst = std::max(worst, diff);
    worst_rel = std::max(worst_rel, rel);
    EXPECT_LE(diff, 2e-4) << a[i].first;
    EXPECT_LE(rel, 1e-4) << a[i].first;
    if (a[i].first.find(".lora_B.") != std::string::npos && a[i].second.abs().max().item<double>() > 0) ++moved_b;
  }
  std::printf("final adapters and merger, world 2 vs world 1: max |diff| %.3g, max relative L2 per tensor %.3g\n",
              worst, worst_rel);
  EXPECT_EQ(moved_b, 4 * 7);  // every lora_B left zero (B starts at 0: the adapters trained)
}

TEST_F(TrainLoraDist, CheckpointHoldsOnlyTrainableState) {
  const std::string ckpt = full_run(2) / "run/step-00000006";
  vlm::app::CheckpointReader reader(ckpt);
  // trainer.json: the frozen units (the LoRA bases, the vision tower, embedding, norm) are
  // not stored; the adapter rows and the merger are.
  std::set<std::string> stored_units;
  for (const auto& u : reader.trainer_json().at("units")) {
    const std::string path = u.at("path");
    const bool trainable = u.at("trainable"), stored = u.at("stored");
    EXPECT_EQ(stored, trainable) << path;
    const bool adapter = path.size() > 5 && path.compare(path.size() - 5, 5, "+lora") == 0;
    EXPECT_EQ(trainable, adapter || path == "visual.merger") << path;
    if (path.rfind("model.layers.", 0) == 0 && !adapter) {  // the LoRA base: FSDP of the frozen weights
      EXPECT_EQ(u.at("sharding"), vlm::sharding::sharding_name(vlm::sharding::Sharding::kFrozenSharded)) << path;
    }
    if (stored) stored_units.insert(path);
  }
  EXPECT_EQ(stored_units.size(), 4u + 1u);  // model.layers.{0..3}+lora, visual.merger
  // The rank files: the optimizer state of those units and the RNG, no frozen "/param".
  int files = 0;
  for (const auto& e : fs::directory_iterator(ckpt)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("state-rank", 0) != 0) continue;
    ++files;
    for (const std::string& key : vlm::SafetensorsFile::open(e.path().string()).names()) {
      if (key == "rng/cpu") continue;
      EXPECT_TRUE(stored_units.count(key.substr(0, key.rfind('/')))) << name << ": " << key;
      EXPECT_EQ(key.find("/param"), std::string::npos) << name << ": " << key;
    }
  }
  EXPECT_EQ(files, 2);
  // consolidated(): exactly the adapters and the merger, with their shapes.
  const auto want = lora_expected_tensors();
  std::map<std::string, std::vector<int64_t>> got;
  for (const auto& [name, t] : reader.consolidated()) got[name] = t.sizes().vec();
  EXPECT_EQ(got, want);
  EXPECT_EQ(want.size(), 4u * 7u * 2u + 6u);  // 56 adapter tensors + the merger's 6
}

TEST_F(TrainLoraDist, ResumesWrittenAtWorldTwoOntoWorldOne) {
  const TempDir& w2 = full_run(2);
  const auto full = vlm::test::losses_by_step(w2 / "run");
  // Interrupted after step 3: its checkpoint and the metrics of steps 1-3 only.
  TempDir dir("lora-resume");
  fs::create_directories(dir / "run");
  fs::copy(w2 / "run/step-00000003", dir / "run/step-00000003", fs::copy_options::recursive);
  {
    std::ofstream out(dir / "run/metrics.jsonl");
    for (const auto& j : vlm::test::metrics_lines(w2 / "run"))
      if (j.at("step").get<int64_t>() <= 3) out << j.dump() << "\n";
  }
  auto res = lora_train(1, lora_recipe(dir, 4));
  ASSERT_TRUE(vlm::test::all_ok(res));
  EXPECT_NE(res[0].output.find("written by 2 rank(s), now 1"), std::string::npos) << res[0].output;
  lora_expect_losses_close(vlm::test::losses_by_step(dir / "run"), full, 4, kLoraSteps, 1e-5);
}

TEST_F(TrainLoraDist, BadLoraRulesFailWithClearErrors) {
  TempDir dir("lora-bad");
  auto train_fails = [&](const std::string& recipe) {
    auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "train", recipe}, std::chrono::seconds(60));
    EXPECT_NE(r.exit_code, 0) << r.output;
    return r.output;
  };
  {  // r = 0: the recipe's range check, at the key's line
    const std::string rp = lora_recipe(dir, 2, R"(
[[sharding.module]]
match = "model.layers.*.self_attn.q_proj"
policy = "lora"
r = 0
)");
    const std::string out = train_fails(rp);
    const std::string at = rp + ":" + std::to_string(lora_line_of(rp, "r = 0"));
    EXPECT_NE(out.find(at), std::string::npos) << "want " << at << " in:\n" << out;
    EXPECT_NE(out.find("sharding.module[0].r"), std::string::npos) << out;
  }
  {  // r on a rule that is not lora
    const std::string rp = lora_recipe(dir, 2, R"(
[[sharding.module]]
match = "visual.merger"
policy = "ddp"
r = 4
)");
    const std::string out = train_fails(rp);
    const std::string at = rp + ":" + std::to_string(lora_line_of(rp, "r = 4"));
    EXPECT_NE(out.find(at), std::string::npos) << "want " << at << " in:\n" << out;
    EXPECT_NE(out.find("only policy = \"lora\" takes 'r'"), std::string::npos) << out;
  }
  {  // lm_head of an untied model takes no adapter (plan builds qwen2-vl-7b on the meta device)
    const std::string rp = lora_recipe(dir, 2, R"(
[[sharding.module]]
match = "lm_head"
policy = "lora"
)");
    auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", rp, "--preset", "qwen2-vl-7b"}, std::chrono::seconds(60));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("selects lm_head, which takes no adapter"), std::string::npos) << r.output;
  }
}

}  // namespace
