// Expert-parallel checkpoints through the vlmtrain binary (real processes, Gloo over
// loopback, hard timeouts), on the tiny Qwen3-VL-MoE preset (8 experts):
//   - a checkpoint written at world 4 with dist.ep = 4 (each rank holds 2 experts; their
//     optimizer state is stored per parameter over all 8) resumes at world 2 with ep = 2 and
//     at world 1 without ep, on the uninterrupted ep run's loss curve;
//   - the other way: a world-1 checkpoint resumes at world 2 with ep = 2;
//   - `vlmtrain export` of the ep checkpoint writes every expert (gate_up_proj [8, ...]) and
//     equals the world-1 run's checkpoint of the same step;
//   - ep 2 at world 4: two ranks hold the same experts and split their AdamW state (ZeRO-1
//     over the expert-replicate group); the run equals one process, its checkpoint (each
//     replica writes its half) resumes at world 1 and at ep 4.
// References: the trainer's own runs. An ep run equals one process up to the order of float
// sums (sharding_expert_parallel_dist_test: gradients within 6e-6 over 10 steps), so the
// curves and the parameters are compared within 1e-5.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/train/checkpoint.h"
#include "tests/app/train/train_testing.h"
#include "tests/dist_testing.h"
#include "tests/testing.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/config.h"
#include "vlm/model/vision_language_model.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;

namespace {

TempDir* g_ep_data = nullptr;

class TrainExpertResume : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_ep_data = new TempDir("ep-train-data");
    vlm::test::make_synth_data(g_ep_data->path(), 48, 7);
  }
  static void TearDownTestSuite() {
    delete g_ep_data;
    g_ep_data = nullptr;
  }

  // The tiny MoE model, 6 steps, a checkpoint every 3; with ep > 1, the experts are split over
  // dist.ep = ep ranks (the world), the rest DDP.
  static std::string recipe(const TempDir& dir, int ep, int samples_per_rank) {
    const std::string path = dir / "recipe.toml";
    std::string text = R"(
[run]
output_dir = ")" + (dir / "run") + R"("
seed = 3
[model]
preset = "tiny-qwen3-moe"
tokenizer = ")" + (*g_ep_data / "tokenizer.model") + R"("
[data]
train = [")" + (*g_ep_data / "train.jsonl") + R"("]
format = "ocr"
prompt = "Read the text."
max_image_tokens = 64
max_seq_len = 192
num_workers = 1
[batch]
samples_per_rank = )" + std::to_string(samples_per_rank) + R"(
max_tokens = 512
max_image_tokens = 512
[optim]
lr = 2e-3
weight_decay = 0.01
[schedule]
steps = 6
warmup_steps = 2
[sharding]
default = "ddp"
)";
    if (ep > 1) text += "[[sharding.module]]\nmatch = \"*.mlp.experts\"\npolicy = \"ep\"\n";
    text += "[dist]\ntimeout_s = 60\n";
    if (ep > 1) text += "ep = " + std::to_string(ep) + "\n";
    text += "[checkpoint]\nevery = 3\nkeep_last = 5\n[eval]\nat_end = false\n[log]\nevery = 1\n";
    vlm::test::write_file(path, text);
    return path;
  }

  static std::vector<vlm::test::WorkerResult> train(int world, const std::string& recipe_path) {
    return vlm::test::run_ranks(world, {vlm::test::vlmtrain_bin(), "train", recipe_path}, std::chrono::seconds(300));
  }
};

void expect_curve(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want, int64_t from,
                  int64_t to) {
  for (int64_t s = from; s <= to; ++s) {
    ASSERT_TRUE(got.count(s) && want.count(s)) << "step " << s << " missing";
    EXPECT_NEAR(got.at(s), want.at(s), 1e-5 * std::abs(want.at(s))) << "step " << s;
  }
}

TEST_F(TrainExpertResume, Ep4CheckpointResumesAtEp2AndWorld1AndBackAndExports) {
  // The two uninterrupted runs: world 4 with ep 4, world 1 without; global batch 4.
  TempDir ep_dir("ep-run"), one_dir("ep-one");
  auto ep_run = train(4, recipe(ep_dir, 4, 1));
  ASSERT_TRUE(vlm::test::all_ok(ep_run));
  EXPECT_NE(ep_run[0].output.find("experts (ep)"), std::string::npos) << ep_run[0].output;
  ASSERT_TRUE(vlm::test::all_ok(train(1, recipe(one_dir, 1, 4))));
  const auto ep_curve = vlm::test::losses_by_step(ep_dir / "run");
  const auto one_curve = vlm::test::losses_by_step(one_dir / "run");
  ASSERT_EQ(ep_curve.size(), 6u);
  expect_curve(ep_curve, one_curve, 1, 6);  // the ep run is the one-process run

  for (const int world : {2, 1}) {  // ep 4 at world 4 -> ep 2 at world 2, and -> world 1 without ep
    SCOPED_TRACE("ep 4 -> world " + std::to_string(world));
    TempDir dir("ep-to-" + std::to_string(world));
    vlm::test::copy_checkpoint_run(ep_dir / "run", dir / "run", 3);
    auto res = train(world, recipe(dir, world, 4 / world));
    ASSERT_TRUE(vlm::test::all_ok(res));
    EXPECT_NE(res[0].output.find("written by 4 rank(s), now " + std::to_string(world)), std::string::npos)
        << res[0].output;
    expect_curve(vlm::test::losses_by_step(dir / "run"), ep_curve, 4, 6);
  }
  {  // world 1 -> ep 2 at world 2
    SCOPED_TRACE("world 1 -> ep");
    TempDir dir("one-to-ep");
    vlm::test::copy_checkpoint_run(one_dir / "run", dir / "run", 3);
    auto res = train(2, recipe(dir, 2, 2));
    ASSERT_TRUE(vlm::test::all_ok(res));
    EXPECT_NE(res[0].output.find("written by 1 rank(s), now 2"), std::string::npos) << res[0].output;
    expect_curve(vlm::test::losses_by_step(dir / "run"), one_curve, 4, 6);
  }

  // Export of the ep checkpoint: every parameter at its full shape, exactly the checkpoint's
  // masters, which equal the world-1 run's of the same step within 1e-4 (a twentieth of one
  // Adam step at lr 2e-3; measured worst 1.9e-5, an attention weight whose near-zero gradient
  // Adam divides by a small second moment; a misplaced expert would be off by its weights,
  // ~0.02). vlmtrain's loader takes the directory.
  const vlm::NamedTensors ep_ck = vlm::app::CheckpointReader(ep_dir / "run/step-00000003").consolidated();
  const vlm::NamedTensors one_ck = vlm::app::CheckpointReader(one_dir / "run/step-00000003").consolidated();
  std::map<std::string, torch::Tensor> ep_by_name(ep_ck.begin(), ep_ck.end());
  const std::string out = ep_dir / "hf";
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", ep_dir / "run/step-00000003", "--out",
                           out, "--dtype", "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  vlm::VisionLanguageModel model(vlm::load_hf_config(out));
  vlm::load_module_weights(*model, out);
  std::map<std::string, torch::Tensor> exported;
  for (const auto& p : model->named_parameters()) exported[p.key()] = p.value();
  int experts = 0;
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, want] : one_ck) {
    ASSERT_TRUE(exported.count(name) && ep_by_name.count(name)) << name;
    ASSERT_EQ(exported[name].sizes(), want.sizes()) << name;
    EXPECT_TRUE(torch::equal(exported[name], ep_by_name[name])) << name;
    EXPECT_TRUE(torch::allclose(exported[name], want, 0, 1e-4))
        << name << ": max diff " << (exported[name] - want).abs().max().item<double>();
    const double d = (exported[name] - want).abs().max().item<double>();
    if (d > worst) worst = d, worst_name = name;
    if (name.find("mlp.experts.gate_up_proj") != std::string::npos) {
      EXPECT_EQ(want.size(0), 8) << name;
      ++experts;
    }
  }
  EXPECT_EQ(exported.size(), one_ck.size());
  EXPECT_EQ(ep_ck.size(), one_ck.size());
  EXPECT_EQ(experts, 3);  // layers 1-3 are sparse
  std::printf("ep 4 checkpoint export vs world-1 checkpoint: worst |diff| %.3g (%s)\n", worst, worst_name.c_str());
}

TEST_F(TrainExpertResume, Ep2AtWorld4ShardsTheExpertStateAndResumes) {
  TempDir ep_dir("ep2w4-run"), one_dir("ep2w4-one");
  auto ep_run = train(4, recipe(ep_dir, 2, 1));
  ASSERT_TRUE(vlm::test::all_ok(ep_run));
  ASSERT_TRUE(vlm::test::all_ok(train(1, recipe(one_dir, 1, 4))));
  const auto ep_curve = vlm::test::losses_by_step(ep_dir / "run");
  ASSERT_EQ(ep_curve.size(), 6u);
  expect_curve(ep_curve, vlm::test::losses_by_step(one_dir / "run"), 1, 6);
  // Each expert vector is written once: half by each replica.
  const vlm::app::CheckpointReader ck(ep_dir / "run/step-00000003");
  const std::string key = "model.layers.1.mlp.experts.gate_up_proj/exp_avg";
  ASSERT_EQ(ck.numel(key), 8 * 2 * 128 * 256);
  EXPECT_EQ(ck.read(key, 0, ck.numel(key)).numel(), ck.numel(key));
  for (const auto& [world, ep] : {std::pair<int, int>{1, 1}, {4, 4}}) {
    SCOPED_TRACE("ep 2 at world 4 -> ep " + std::to_string(ep) + " at world " + std::to_string(world));
    TempDir dir("ep2w4-to-" + std::to_string(world));
    vlm::test::copy_checkpoint_run(ep_dir / "run", dir / "run", 3);
    auto res = train(world, recipe(dir, ep, 4 / world));
    ASSERT_TRUE(vlm::test::all_ok(res));
    expect_curve(vlm::test::losses_by_step(dir / "run"), ep_curve, 4, 6);
  }
}

}  // namespace
