// Tensor parallelism through the vlmtrain binary (real processes, Gloo over loopback, hard
// timeouts), recipes/ocr_tiny.toml (tiny Qwen2-VL: 4 heads, 2 key/value heads, tied
// embeddings) on synthetic OCR data, 6 steps of a global batch of 4 samples:
//   - dist.tp = 2 at world 2 (one data-parallel group) and at world 4 (two, DDP over each tp
//     rank's data-parallel pair) follow the world-1 run's loss curve within 1e-5 relative and
//     count each supervised token once; so does a packed tp 2 run;
//   - the tp 2 run's checkpoint of step 3 resumes at world 4 (tp 2, two data-parallel ranks)
//     and at world 1 (tp 1) on the tp 2 run's curve, and the world-1 run's at dp 2 x tp 2 on
//     the world-1 curve (the optimizer state moves between layouts parameter by parameter);
//   - `vlmtrain export` of the tp 2 checkpoint of step 6 puts the slices back together: every
//     parameter at its full shape, within 1e-4 of the world-1 run's checkpoint of step 6 (the
//     same bound as the expert-parallel export: a fraction of one Adam step at lr 2e-3);
//   - a tp that does not divide the attention heads, and tp with cp, stop every rank at
//     start-up with the reason;
//   - a rank of the tp group that dies mid-run ends the other with the collective named.
// Equality with one process to the order of float sums is sharding_tensor_parallel_dist_test's
// (fp64 reference), so the curves are compared within 1e-5 relative.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>

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

TempDir* g_tp_data = nullptr;

class TrainTensorParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_tp_data = new TempDir("tp-train-data");
    vlm::test::make_synth_data(g_tp_data->path(), 48, 5);
  }
  static void TearDownTestSuite() {
    delete g_tp_data;
    g_tp_data = nullptr;
  }

  // 6 steps of 4 samples (samples_per_rank = 4 / (world / tp)), checkpoints every 3 steps.
  static std::vector<vlm::test::WorkerResult> train(const std::string& run_dir, int world, int tp, bool packing,
                                                    const std::vector<std::string>& extra = {}) {
    auto args = vlm::test::tiny_train_args(run_dir, g_tp_data->path(), 6, 3);
    const int dp = world / tp;
    for (const std::string& s : {"batch.samples_per_rank=" + std::to_string(4 / std::max(dp, 1)),
                                 "dist.tp=" + std::to_string(tp), std::string("batch.packing=") +
                                 (packing ? "true" : "false"), std::string("checkpoint.keep_last=5")}) {
      args.push_back("--set");
      args.push_back(s);
    }
    for (const auto& s : extra) args.push_back(s);
    return vlm::test::run_ranks(world, args, std::chrono::seconds(300));
  }

  static std::map<int64_t, int64_t> tokens_by_step(const std::string& run_dir) {
    std::map<int64_t, int64_t> out;
    for (const auto& j : vlm::test::metrics_lines(run_dir))
      if (j.contains("supervised_tokens")) out[j.at("step").get<int64_t>()] = j.at("supervised_tokens").get<int64_t>();
    return out;
  }
};

void expect_tp_curve(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want, int64_t from,
                     int64_t to, const std::string& what) {
  for (int64_t s = from; s <= to; ++s) {
    ASSERT_TRUE(got.count(s) && want.count(s)) << what << ": step " << s << " missing";
    EXPECT_NEAR(got.at(s), want.at(s), 1e-5 * std::abs(want.at(s))) << what << ": step " << s;
  }
}

TEST_F(TrainTensorParallel, FollowsOneProcessResumesAndExports) {
  TempDir one("tp-one"), tp2("tp-w2"), dp2tp2("tp-w4");
  ASSERT_TRUE(vlm::test::all_ok(train(one / "run", 1, 1, false)));
  auto r2 = train(tp2 / "run", 2, 2, false);
  ASSERT_TRUE(vlm::test::all_ok(r2));
  EXPECT_NE(r2[0].output.find("per group of 2 tensor-parallel ranks"), std::string::npos) << r2[0].output;
  EXPECT_NE(r2[0].output.find("tensor-parallel slice 0 of 2"), std::string::npos) << r2[0].output;
  ASSERT_TRUE(vlm::test::all_ok(train(dp2tp2 / "run", 4, 2, false)));
  const auto want = vlm::test::losses_by_step(one / "run");
  ASSERT_EQ(want.size(), 6u);
  expect_tp_curve(vlm::test::losses_by_step(tp2 / "run"), want, 1, 6, "tp 2 at world 2");
  expect_tp_curve(vlm::test::losses_by_step(dp2tp2 / "run"), want, 1, 6, "dp 2 x tp 2 at world 4");
  EXPECT_EQ(tokens_by_step(tp2 / "run"), tokens_by_step(one / "run"));
  EXPECT_EQ(tokens_by_step(dp2tp2 / "run"), tokens_by_step(one / "run"));
  {  // tp 2 at world 2 -> tp 2 at world 4
    TempDir dir("tp-resume");
    vlm::test::copy_checkpoint_run(tp2 / "run", dir / "run", 3);
    ASSERT_TRUE(vlm::test::all_ok(train(dir / "run", 4, 2, false)));
    expect_tp_curve(vlm::test::losses_by_step(dir / "run"), vlm::test::losses_by_step(tp2 / "run"), 4, 6,
                    "tp 2 world 2 -> tp 2 world 4");
  }
  {  // tp 2 -> world 1 (tp 1): each parameter's state put back together
    TempDir dir("tp-to-one");
    vlm::test::copy_checkpoint_run(tp2 / "run", dir / "run", 3);
    ASSERT_TRUE(vlm::test::all_ok(train(dir / "run", 1, 1, false)));
    expect_tp_curve(vlm::test::losses_by_step(dir / "run"), vlm::test::losses_by_step(tp2 / "run"), 4, 6,
                    "tp 2 -> world 1");
  }
  {  // world 1 -> dp 2 x tp 2 at world 4: each parameter's state cut to the rank's slice
    TempDir dir("one-to-tp");
    vlm::test::copy_checkpoint_run(one / "run", dir / "run", 3);
    ASSERT_TRUE(vlm::test::all_ok(train(dir / "run", 4, 2, false)));
    expect_tp_curve(vlm::test::losses_by_step(dir / "run"), want, 4, 6, "world 1 -> dp 2 x tp 2");
  }
  // Export: the slices put back together.
  const vlm::NamedTensors one_ck = vlm::app::CheckpointReader(one / "run/step-00000006").consolidated();
  vlm::test::expect_export_matches(tp2 / "run/step-00000006", tp2 / "hf", one_ck, 1e-4,
                                   "tp 2 checkpoint export vs world-1 checkpoint");
}

TEST_F(TrainTensorParallel, PackedFollowsOneProcess) {
  TempDir one("tp-one-packed"), tp2("tp-w2-packed");
  ASSERT_TRUE(vlm::test::all_ok(train(one / "run", 1, 1, true)));
  ASSERT_TRUE(vlm::test::all_ok(train(tp2 / "run", 2, 2, true)));
  expect_tp_curve(vlm::test::losses_by_step(tp2 / "run"), vlm::test::losses_by_step(one / "run"), 1, 6,
                  "packed tp 2 at world 2");
  EXPECT_EQ(tokens_by_step(tp2 / "run"), tokens_by_step(one / "run"));
}

// A rank of a tp group dies (VLMTRAIN_FAULT_EXIT: before step 3, no cleanup): the other ends
// with an error naming the collective it was in and the rank that failed, well inside the
// timeout (no hang).
TEST_F(TrainTensorParallel, DeadRankEndsTheOtherWithTheOpNamed) {
  TempDir dir("tp-dead");
  auto args = vlm::test::tiny_train_args(dir / "run", g_tp_data->path(), 6, 0);
  for (const std::string& s : {"dist.tp=2", "batch.samples_per_rank=4", "dist.timeout_s=30"}) {
    args.push_back("--set");
    args.push_back(s);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto res = vlm::test::run_ranks(2, args, std::chrono::seconds(120), {"VLMTRAIN_FAULT_EXIT=3:1"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[1].exit_code, 3) << res[1].output;
  EXPECT_NE(res[0].exit_code, 0) << res[0].output;
  EXPECT_FALSE(res[0].timed_out) << res[0].output;
  EXPECT_NE(res[0].output.find("all_reduce"), std::string::npos) << res[0].output;
  EXPECT_LT(seconds, 90) << "within the 30 s collective timeout and the peer reports";
}

TEST_F(TrainTensorParallel, ImpossibleSplitsStopEveryRankAtStartUp) {
  {
    TempDir dir("tp-bad-heads");  // tiny has 4 attention heads
    auto res = train(dir / "run", 3, 3, false);
    ASSERT_EQ(res.size(), 3u);
    for (const auto& r : res) {
      EXPECT_NE(r.exit_code, 0);
      EXPECT_NE(r.output.find("4 attention heads do not divide by tp = 3"), std::string::npos) << r.output;
    }
  }
  {
    TempDir dir("tp-with-cp");
    auto res = train(dir / "run", 4, 2, false, {"--set", "dist.cp=2"});
    ASSERT_EQ(res.size(), 4u);
    for (const auto& r : res) {
      EXPECT_NE(r.exit_code, 0);
      EXPECT_NE(r.output.find("tensor parallelism with context or expert parallelism is not built yet"),
                std::string::npos)
          << r.output;
    }
  }
}

}  // namespace
