// Context parallelism through the vlmtrain binary (real processes, Gloo over loopback, hard
// timeouts), recipes/ocr_tiny.toml (tiny Qwen2-VL) on synthetic OCR data, 6 steps of a global
// batch of 4 samples, padded and packed:
//   - dist.cp = 2 at world 2 (one data-parallel group) and dist.cp = 2 at world 4 (two) follow
//     the world-1 run's loss curve, and count each supervised token once (the metrics'
//     supervised_tokens equal the world-1 run's); so does dist.cp_mode = "ring" at cp 4, world 4;
//   - a checkpoint of the cp 2 run (step 3) resumes at world 1 on the cp run's curve, and a
//     world-1 checkpoint resumes at cp 2;
//   - a recipe whose cp does not divide the world, or does not divide the heads, stops every
//     rank at start-up with the reason.
// References: the trainer's own world-1 runs. Equality with one process to the order of float
// sums is sharding_context_parallel_dist_test's (gradients within 1e-6 over 10 steps), so the
// curves are compared within 1e-5 relative.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/app/train/train_testing.h"
#include "tests/dist_testing.h"
#include "tests/testing.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;

namespace {

TempDir* g_cp_data = nullptr;

class TrainContextParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_cp_data = new TempDir("cp-train-data");
    vlm::test::make_synth_data(g_cp_data->path(), 48, 5);
  }
  static void TearDownTestSuite() {
    delete g_cp_data;
    g_cp_data = nullptr;
  }

  // 6 steps of 4 samples (samples_per_rank = 4 / (world / cp)), checkpoints every 3 steps.
  static std::vector<vlm::test::WorkerResult> train(const std::string& run_dir, int world, int cp, bool packing,
                                                    const std::vector<std::string>& extra = {}) {
    auto args = vlm::test::tiny_train_args(run_dir, g_cp_data->path(), 6, 3);
    const int dp = world / cp;
    for (const std::string& s : {"batch.samples_per_rank=" + std::to_string(4 / std::max(dp, 1)),
                                 "dist.cp=" + std::to_string(cp), std::string("batch.packing=") +
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

void expect_cp_curve(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want, int64_t from,
                     int64_t to, const std::string& what) {
  for (int64_t s = from; s <= to; ++s) {
    ASSERT_TRUE(got.count(s) && want.count(s)) << what << ": step " << s << " missing";
    EXPECT_NEAR(got.at(s), want.at(s), 1e-5 * std::abs(want.at(s))) << what << ": step " << s;
  }
}

TEST_F(TrainContextParallel, FollowsOneProcessPaddedAndPackedInBothModesAndResumesAcrossCp) {
  for (const bool packing : {false, true}) {
    SCOPED_TRACE(packing ? "packed" : "padded");
    TempDir one("cp-one"), cp2("cp-w2"), dp2cp2("cp-w4");
    ASSERT_TRUE(vlm::test::all_ok(train(one / "run", 1, 1, packing)));
    auto r2 = train(cp2 / "run", 2, 2, packing);
    ASSERT_TRUE(vlm::test::all_ok(r2));
    EXPECT_NE(r2[0].output.find("per group of 2 context-parallel ranks"), std::string::npos) << r2[0].output;
    auto r4 = train(dp2cp2 / "run", 4, 2, packing);
    ASSERT_TRUE(vlm::test::all_ok(r4));
    const auto want = vlm::test::losses_by_step(one / "run");
    ASSERT_EQ(want.size(), 6u);
    expect_cp_curve(vlm::test::losses_by_step(cp2 / "run"), want, 1, 6, "cp 2 at world 2");
    expect_cp_curve(vlm::test::losses_by_step(dp2cp2 / "run"), want, 1, 6, "dp 2 x cp 2 at world 4");
    EXPECT_EQ(tokens_by_step(cp2 / "run"), tokens_by_step(one / "run"));
    EXPECT_EQ(tokens_by_step(dp2cp2 / "run"), tokens_by_step(one / "run"));
    {  // ring mode: cp 4 at world 4
      TempDir ring("cp-ring");
      auto rr = train(ring / "run", 4, 4, packing, {"--set", "dist.cp_mode=ring"});
      ASSERT_TRUE(vlm::test::all_ok(rr));
      EXPECT_NE(rr[0].output.find("per group of 4 context-parallel ranks"), std::string::npos) << rr[0].output;
      expect_cp_curve(vlm::test::losses_by_step(ring / "run"), want, 1, 6, "ring cp 4 at world 4");
      EXPECT_EQ(tokens_by_step(ring / "run"), tokens_by_step(one / "run"));
    }
    if (packing) continue;
    {  // cp 2 checkpoint -> world 1
      TempDir dir("cp-to-one");
      vlm::test::copy_checkpoint_run(cp2 / "run", dir / "run", 3);
      ASSERT_TRUE(vlm::test::all_ok(train(dir / "run", 1, 1, packing)));
      expect_cp_curve(vlm::test::losses_by_step(dir / "run"), vlm::test::losses_by_step(cp2 / "run"), 4, 6,
                      "cp 2 -> world 1");
    }
    {  // world 1 checkpoint -> cp 2 at world 4
      TempDir dir("one-to-cp");
      vlm::test::copy_checkpoint_run(one / "run", dir / "run", 3);
      ASSERT_TRUE(vlm::test::all_ok(train(dir / "run", 4, 2, packing)));
      expect_cp_curve(vlm::test::losses_by_step(dir / "run"), want, 4, 6, "world 1 -> dp 2 x cp 2");
    }
  }
}

TEST_F(TrainContextParallel, ImpossibleSplitsStopEveryRankAtStartUp) {
  {
    TempDir dir("cp-bad-world");
    auto res = train(dir / "run", 2, 4, false);
    ASSERT_EQ(res.size(), 2u);
    for (const auto& r : res) {
      EXPECT_NE(r.exit_code, 0);
      EXPECT_NE(r.output.find("dist.cp = 4 does not divide the world size 2"), std::string::npos) << r.output;
    }
  }
  {
    TempDir dir("cp-bad-heads");  // tiny has 4 attention heads
    auto res = train(dir / "run", 8, 8, false);
    ASSERT_EQ(res.size(), 8u);
    for (const auto& r : res) {
      EXPECT_NE(r.exit_code, 0);
      EXPECT_NE(r.output.find("4 attention heads do not divide by cp = 8"), std::string::npos) << r.output;
    }
  }
}

}  // namespace
