// The data plane's watchdog (sharding/dist/comm_watchdog.h): a rank whose collective never
// completes while its host never waits (what NCCL's stream-only wait() gives) is ended by
// the watchdog with the comm layer's report: on stderr and in the error file, naming the
// op, its context and the plane, exit code 1, within the timeout + the peer-report wait.
// Run on Gloo with the shared-memory channel off, so the ops are process-group works.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "sharding/dist/comm.h"
#include "sharding/dist/comm_watchdog.h"
#include "sharding/dist/parallel_dims.h"
#include "tests/dist_testing.h"
#include "tests/testing.h"

using namespace vlm::sharding;

TEST(CommWatchdogDist, DISABLED_StuckOpWorker) {
  VLM_DIST_WORKER_ONLY();
  ParallelOptions o;
  o.timeout = std::chrono::seconds(3);
  o.device = "cpu";
  ParallelDims dims = ParallelDims::init(detect_dist_env(process_env()), o);
  dims.start_watchdog();
  ASSERT_TRUE(dims.comm().watchdog_running());
  torch::Tensor t = torch::ones({1000});
  dims.comm().all_reduce(t, ReduceOp::kSum, "warm-up, both ranks");
  EXPECT_EQ(t[0].item<float>(), 2.0f);
  if (dims.rank() == 1) {  // never enters the next op, then leaves quietly
    std::this_thread::sleep_for(std::chrono::seconds(12));
    return;
  }
  Work w = dims.comm().all_reduce_async(t, ReduceOp::kSum, "the op rank 1 never joins");
  std::this_thread::sleep_for(std::chrono::seconds(30));  // the host never waits: only the watchdog ends this
  ADD_FAILURE() << "the watchdog did not end the process";
}

TEST(CommWatchdogDist, StuckOpEndsTheRankWithTheCommReport) {
  vlm::test::TempDir dir("comm_watchdog");
  vlm::test::DistRun run;
  run.world_size = 2;
  run.timeout = std::chrono::seconds(60);
  run.worker_test = "CommWatchdogDist.DISABLED_StuckOpWorker";
  const std::string base = dir.path();
  run.extra_env = [base](int rank) {
    return std::vector<std::string>{"TORCHELASTIC_ERROR_FILE=" + base + "/rank" + std::to_string(rank) + ".json"};
  };
  const auto results = vlm::test::run_workers(run);
  ASSERT_EQ(results.size(), 2u);
  const auto& r0 = results[0];
  EXPECT_EQ(r0.exit_code, 1) << r0.output;
  EXPECT_FALSE(r0.timed_out) << r0.output;
  EXPECT_LT(r0.seconds, 3 + 5 + 5.0) << "timeout 3 s + peer reports 5 s + start-up";
  EXPECT_EQ(results[1].exit_code, 0) << results[1].output;
  const std::string err = vlm::test::read_file(base + "/rank0.json");
  for (const char* want : {"all_reduce", "the op rank 1 never joins", "data plane", "failed on rank 0 of 2",
                           "last op each rank entered"})
    EXPECT_NE(err.find(want), std::string::npos) << "error file lacks '" << want << "':\n" << err;
  EXPECT_NE(r0.output.find("the op rank 1 never joins"), std::string::npos) << r0.output;
  std::printf("rank 0 ended after %.1f s; its error file:\n%s\n", r0.seconds, err.c_str());
}
