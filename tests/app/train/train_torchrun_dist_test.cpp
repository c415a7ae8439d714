// vlmtrain under the real torchrun (the one of the build's Python environment, torch 2.11),
// unchanged:
//  - 2 workers train the tiny recipe and log exactly the losses of the same job started
//    by `vlmtrain launch --nproc-per-node 2`;
//  - --max_restarts 1 with one rank dying abruptly once: torchrun restarts the workers,
//    they resume from the last complete checkpoint and finish the job.
// A missing torchrun fails the tests, naming where it was looked for.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/dist_testing.h"
#include "tests/app/train/train_testing.h"
#include "tests/testing.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;

namespace {

TempDir* g_torchrun_data = nullptr;

class TrainTorchrun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_torchrun_data = new TempDir("torchrun-data");
    vlm::test::make_synth_data(g_torchrun_data->path(), 48, 11);
  }
  static void TearDownTestSuite() {
    delete g_torchrun_data;
    g_torchrun_data = nullptr;
  }
  std::vector<std::string> train_args(const TempDir& dir, int steps) {
    return vlm::test::tiny_train_args(dir / "run", g_torchrun_data->path(), steps, 2);
  }
  vlm::test::RunResult torchrun(const std::vector<std::string>& args, const std::vector<std::string>& extra_flags,
                              const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {vlm::test::python_tool("torchrun"), "--standalone", "--nproc_per_node=2",
                                     "--no_python"};
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> full_env = env;
    full_env.push_back("OMP_NUM_THREADS=1");
    return vlm::test::run(argv, std::chrono::seconds(300), full_env);
  }
};


TEST_F(TrainTorchrun, MatchesTheSameJobUnderVlmtrainLaunch) {
  TempDir a("torchrun"), b("launch");
  auto r = torchrun(train_args(a, 4), {});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // `vlmtrain launch --nproc-per-node 2 train RECIPE --set ...` (OMP_NUM_THREADS=1 like torchrun).
  std::vector<std::string> launch = {vlm::test::vlmtrain_bin(), "launch", "--nproc-per-node", "2"};
  const auto args = train_args(b, 4);
  launch.insert(launch.end(), args.begin() + 1, args.end());
  auto l = vlm::test::run(launch, std::chrono::seconds(240));
  ASSERT_EQ(l.exit_code, 0) << l.output;
  const auto la = vlm::test::losses_by_step(a / "run"), lb = vlm::test::losses_by_step(b / "run");
  ASSERT_EQ(la.size(), 4u) << r.output;
  EXPECT_EQ(la, lb);  // same world, same data, same reductions: bit for bit
}

TEST_F(TrainTorchrun, MaxRestartsResumesFromTheLastCompleteCheckpoint) {
  TempDir a("restart");
  // Rank 1 dies before step 4 in the first attempt; checkpoints exist at step 2.
  auto r = torchrun(train_args(a, 6), {"--max_restarts", "1"}, {"VLMTRAIN_FAULT_EXIT=4:1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("VLMTRAIN_FAULT_EXIT: rank 1 exits before step 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from " + (a / "run/step-00000002")), std::string::npos) << r.output;
  const auto l = vlm::test::losses_by_step(a / "run");
  ASSERT_EQ(l.size(), 6u);
  EXPECT_TRUE(fs::exists(a / "run/step-00000006/COMPLETE"));
  // The job equals an uninterrupted one.
  TempDir b("norestart");
  ASSERT_TRUE(vlm::test::all_ok(vlm::test::run_ranks(2, train_args(b, 6), std::chrono::seconds(240), {"OMP_NUM_THREADS=1"})));
  EXPECT_EQ(l, vlm::test::losses_by_step(b / "run"));
}

}  // namespace
