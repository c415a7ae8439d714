// Pipeline parallelism through the vlmtrain binary (real processes, Gloo over loopback, hard
// timeouts), recipes/ocr_tiny.toml (tiny Qwen2-VL: 4 decoder layers, tied embeddings) on
// synthetic OCR data, 6 steps of a global batch of 4 samples in micro-batches of one sample
// (batch.max_tokens = 64: 4 micro-batches per step at world 1 and at pp 2, 2 per data-parallel
// group at dp 2 x pp 2):
//   - dist.pp = 2 at world 2, dp 2 x pp 2 at world 4 and pp 2 x tp 2 at world 4 follow the
//     world-1 run's loss curve within 1e-5 relative and count each supervised token once;
//   - the pp 2 run's checkpoint of step 3 resumes at world 1 on its curve, and the world-1
//     run's at dp 2 x pp 2 on the world-1 curve (each stage's units written by its ranks, the
//     tied embedding once, read back by unit from whichever rank file holds it);
//   - `vlmtrain export` of the pp 2 checkpoint of step 6 holds every parameter at its shape,
//     within 1e-4 of the world-1 run's checkpoint of step 6 (the bound of the tensor- and
//     expert-parallel exports);
//   - the 3D layout dp 2 x pp 2 x tp 2 at world 8 follows the world-1 curve, and its
//     checkpoint resumes at world 1;
//   - pp with cp stops every rank at start-up with the reason;
//   - a rank of either stage that dies mid-run ends the other with the op named.
// Equality with one process to the order of float sums is sharding_pipeline_dist_test's (fp64
// reference), so the curves are compared within 1e-5 relative.
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

TempDir* g_pp_data = nullptr;

class TrainPipelineParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_pp_data = new TempDir("pp-train-data");
    vlm::test::make_synth_data(g_pp_data->path(), 48, 5);
  }
  static void TearDownTestSuite() {
    delete g_pp_data;
    g_pp_data = nullptr;
  }

  // 6 steps of 4 samples (samples_per_rank = 4 / dp), checkpoints every 3 steps.
  static std::vector<vlm::test::WorkerResult> train(const std::string& run_dir, int world, int pp, int tp,
                                                    const std::vector<std::string>& extra = {}) {
    auto args = vlm::test::tiny_train_args(run_dir, g_pp_data->path(), 6, 3);
    const int dp = world / (pp * tp);
    for (const std::string& s : {"batch.samples_per_rank=" + std::to_string(4 / std::max(dp, 1)),
                                 "dist.pp=" + std::to_string(pp), "dist.tp=" + std::to_string(tp),
                                 std::string("batch.max_tokens=64"), std::string("checkpoint.keep_last=5")}) {
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

void expect_pp_curve(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want, int64_t from,
                     int64_t to, const std::string& what) {
  for (int64_t s = from; s <= to; ++s) {
    ASSERT_TRUE(got.count(s) && want.count(s)) << what << ": step " << s << " missing";
    EXPECT_NEAR(got.at(s), want.at(s), 1e-5 * std::abs(want.at(s))) << what << ": step " << s;
  }
}

TEST_F(TrainPipelineParallel, FollowsOneProcessResumesAndExports) {
  TempDir one("pp-one"), pp2("pp-w2"), dp2pp2("pp-w4"), pp2tp2("pp-tp-w4");
  ASSERT_TRUE(vlm::test::all_ok(train(one / "run", 1, 1, 1)));
  auto r2 = train(pp2 / "run", 2, 2, 1);
  ASSERT_TRUE(vlm::test::all_ok(r2));
  EXPECT_NE(r2[0].output.find("pipeline: 2 stages of 1 rank(s), 1F1B: stage 0: layers [0, "), std::string::npos)
      << r2[0].output;
  EXPECT_NE(r2[0].output.find("| bubble 20% |"), std::string::npos) << "m = 4, p = 2: 1 / 5\n" << r2[0].output;
  ASSERT_TRUE(vlm::test::all_ok(train(dp2pp2 / "run", 4, 2, 1)));
  ASSERT_TRUE(vlm::test::all_ok(train(pp2tp2 / "run", 4, 2, 2)));
  const auto want = vlm::test::losses_by_step(one / "run");
  ASSERT_EQ(want.size(), 6u);
  expect_pp_curve(vlm::test::losses_by_step(pp2 / "run"), want, 1, 6, "pp 2 at world 2");
  expect_pp_curve(vlm::test::losses_by_step(dp2pp2 / "run"), want, 1, 6, "dp 2 x pp 2 at world 4");
  expect_pp_curve(vlm::test::losses_by_step(pp2tp2 / "run"), want, 1, 6, "pp 2 x tp 2 at world 4");
  EXPECT_EQ(tokens_by_step(pp2 / "run"), tokens_by_step(one / "run"));
  EXPECT_EQ(tokens_by_step(dp2pp2 / "run"), tokens_by_step(one / "run"));
  EXPECT_EQ(tokens_by_step(pp2tp2 / "run"), tokens_by_step(one / "run"));
  {  // pp 2 -> world 1: every stage's units from its rank file
    TempDir dir("pp-to-one");
    vlm::test::copy_checkpoint_run(pp2 / "run", dir / "run", 3);
    ASSERT_TRUE(vlm::test::all_ok(train(dir / "run", 1, 1, 1)));
    expect_pp_curve(vlm::test::losses_by_step(dir / "run"), vlm::test::losses_by_step(pp2 / "run"), 4, 6,
                    "pp 2 -> world 1");
  }
  {  // world 1 -> dp 2 x pp 2 at world 4
    TempDir dir("one-to-pp");
    vlm::test::copy_checkpoint_run(one / "run", dir / "run", 3);
    ASSERT_TRUE(vlm::test::all_ok(train(dir / "run", 4, 2, 1)));
    expect_pp_curve(vlm::test::losses_by_step(dir / "run"), want, 4, 6, "world 1 -> dp 2 x pp 2");
  }
  // Export: every stage's parameters, the tied embedding once.
  const vlm::NamedTensors one_ck = vlm::app::CheckpointReader(one / "run/step-00000006").consolidated();
  vlm::test::expect_export_matches(pp2 / "run/step-00000006", pp2 / "hf", one_ck, 1e-4,
                                   "pp 2 checkpoint export vs world-1 checkpoint");
}

// The 3D layout dp 2 x pp 2 x tp 2 at world 8 follows the world-1 curve, and its checkpoint
// of step 3 (each stage's units in tp slices) resumes at world 1 on its curve.
TEST_F(TrainPipelineParallel, ThreeDimensionsFollowOneProcessAndResumeAtWorldOne) {
  TempDir one("pp3d-one"), three("pp3d-w8");
  ASSERT_TRUE(vlm::test::all_ok(train(one / "run", 1, 1, 1)));
  ASSERT_TRUE(vlm::test::all_ok(train(three / "run", 8, 2, 2)));
  const auto want = vlm::test::losses_by_step(one / "run");
  expect_pp_curve(vlm::test::losses_by_step(three / "run"), want, 1, 6, "dp 2 x pp 2 x tp 2 at world 8");
  EXPECT_EQ(tokens_by_step(three / "run"), tokens_by_step(one / "run"));
  TempDir dir("pp3d-to-one");
  vlm::test::copy_checkpoint_run(three / "run", dir / "run", 3);
  ASSERT_TRUE(vlm::test::all_ok(train(dir / "run", 1, 1, 1)));
  expect_pp_curve(vlm::test::losses_by_step(dir / "run"), vlm::test::losses_by_step(three / "run"), 4, 6,
                  "dp 2 x pp 2 x tp 2 -> world 1");
}

// A rank of either stage dies (VLMTRAIN_FAULT_EXIT: before step 3, no cleanup): the other
// ends with an error naming the collective it was in, well inside the timeout (no hang).
TEST_F(TrainPipelineParallel, DeadRankOfEitherStageEndsTheOtherWithTheOpNamed) {
  for (int dead : {1, 0}) {
    TempDir dir("pp-dead");
    auto args = vlm::test::tiny_train_args(dir / "run", g_pp_data->path(), 6, 0);
    for (const char* s : {"dist.pp=2", "batch.samples_per_rank=4", "batch.max_tokens=64", "dist.timeout_s=30"}) {
      args.push_back("--set");
      args.push_back(s);
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto res = vlm::test::run_ranks(2, args, std::chrono::seconds(120), {"VLMTRAIN_FAULT_EXIT=3:" + std::to_string(dead)});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(res.size(), 2u);
    const auto& died = res[static_cast<size_t>(dead)];
    const auto& other = res[static_cast<size_t>(1 - dead)];
    EXPECT_EQ(died.exit_code, 3) << died.output;
    EXPECT_NE(other.exit_code, 0) << other.output;
    EXPECT_FALSE(other.timed_out) << other.output;
    EXPECT_NE(other.output.find("comm: all_reduce"), std::string::npos) << "stage " << dead << " died\n" << other.output;
    EXPECT_LT(seconds, 90) << "within the 30 s collective timeout and the peer reports";
  }
}

TEST_F(TrainPipelineParallel, PipelineWithContextParallelismStopsEveryRankAtStartUp) {
  TempDir dir("pp-with-cp");
  auto res = train(dir / "run", 4, 2, 1, {"--set", "dist.cp=2"});
  ASSERT_EQ(res.size(), 4u);
  for (const auto& r : res) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("pipeline parallelism with context or expert parallelism is not built yet"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace
