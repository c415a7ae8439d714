// Harness for multi-process tests: the parent test launches N copies of the current test
// executable, each running one "worker" test body with a launcher-like environment
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=<free>),
// waits for all of them under a hard timeout (killing all on timeout, and the rest a short
// grace period after the first failure), and reports each worker's output on failure.
//
//   TEST(CommDist, DISABLED_AllReduceWorker) {   // DISABLED_: ctest does not run it
//     VLM_DIST_WORKER_ONLY();                     // skipped outside a worker process
//     auto env = vlm::sharding::detect_dist_env(vlm::sharding::process_env());
//     ...
//   }
//   TEST(CommDist, AllReduce3) {
//     vlm::test::DistRun run;  run.world_size = 3;
//     run.worker_test = "CommDist.DISABLED_AllReduceWorker";
//     EXPECT_TRUE(vlm::test::all_ok(vlm::test::run_workers(run)));
//   }
//
// Worker tests are named DISABLED_* so that ctest (gtest_discover_tests) registers them as
// disabled and does not pay a process start for each; workers run with
// --gtest_also_run_disabled_tests. To run one by hand under a real launcher:
//   VLMTRAIN_TEST_DIST_WORKER=1 .venv/bin/torchrun --no-python --nproc-per-node=2
//     <test exe> --gtest_also_run_disabled_tests --gtest_filter=Suite.DISABLED_XWorker
// (one command line; no trailing backslash above, which would continue the // comment)
//
// Workers get a clean environment for the launcher variables (every RANK/SLURM_*/
// TORCHELASTIC_* variable of the parent is removed) and VLMTRAIN_TEST_DIST_WORKER=1.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace vlm::test {

// True inside a worker process started by run_workers.
bool is_dist_worker();

// A TCP port on 127.0.0.1 that was free a moment ago (bind port 0, read it, close).
int free_port();

struct DistRun {
  int world_size = 2;
  std::string worker_test;  // gtest name "Suite.Name" of the worker body
  std::chrono::seconds timeout{90};
  // After the first worker fails, the others get this long before they are killed.
  std::chrono::seconds grace_after_failure{20};
  // Env style: torchrun-like (RANK, ...) or slurm-like (SLURM_PROCID, ...).
  enum class Style { kTorchrun, kSlurm, kNone } style = Style::kTorchrun;
  int master_port = 0;  // 0: pick a free port
  // Extra "K=V" entries for each rank (called with the rank).
  std::function<std::vector<std::string>(int rank)> extra_env;
};

struct WorkerResult {
  int rank = 0;
  int exit_code = -1;  // exit status, 128 + signal, or 124 when killed on timeout
  bool timed_out = false;
  double seconds = 0;
  std::string output;
};

std::vector<WorkerResult> run_workers(const DistRun& run);

// Runs `argv` (e.g. the vlmtrain binary and its arguments) as `world` processes with
// torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR =
// 127.0.0.1, MASTER_PORT = a free port; nothing set when world is 1), all started at
// once, each killed after `timeout`. Results by rank. Retries on a taken port.
std::vector<WorkerResult> run_ranks(int world, const std::vector<std::string>& argv,
                                    std::chrono::seconds timeout = std::chrono::seconds(180),
                                    const std::vector<std::string>& extra_env = {});

// Success when every worker exited 0; otherwise the failure lists every worker's exit code
// and output.
::testing::AssertionResult all_ok(const std::vector<WorkerResult>& results);

}  // namespace vlm::test

#define VLM_DIST_WORKER_ONLY()                                                       \
  do {                                                                               \
    if (!::vlm::test::is_dist_worker())                                                \
      GTEST_SKIP() << "worker body: runs only inside a process started by run_workers"; \
  } while (0)
