// Trainer fault handling through the vlmtrain binary (real processes, hard timeouts):
//  - a non-finite loss on one rank skips that step's update on every rank, the run goes on;
//  - optim.max_bad_steps consecutive non-finite steps end every rank with a clear error
//    (promptly: no rank is left waiting in a collective);
//  - SIGTERM mid-run: the step finishes, a complete checkpoint is written, exit 0, and the
//    next run resumes from it.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/dist_testing.h"
#include "tests/app/train/train_testing.h"
#include "tests/testing.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;

namespace {

TempDir* g_data = nullptr;

class TrainFaults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_data = new TempDir("faults-data");
    vlm::test::make_synth_data(g_data->path(), 48, 9);
  }
  static void TearDownTestSuite() {
    delete g_data;
    g_data = nullptr;
  }
  std::vector<std::string> argv(const TempDir& dir, int steps, const std::vector<std::string>& extra = {}) {
    auto a = vlm::test::tiny_train_args(dir / "run", g_data->path(), steps, 0);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

std::vector<nlohmann::json> metrics(const std::string& run_dir) { return vlm::test::metrics_lines(run_dir); }

nlohmann::json trainer_json(const std::string& ckpt) {
  std::ifstream in(ckpt + "/trainer.json");
  return nlohmann::json::parse(in);
}

TEST_F(TrainFaults, NonFiniteLossOnOneRankSkipsTheStepEverywhere) {
  TempDir dir("nonfinite");
  auto res = vlm::test::run_ranks(2, argv(dir, 4), std::chrono::seconds(180), {"VLMTRAIN_FAULT_NONFINITE=2:1"});
  ASSERT_TRUE(vlm::test::all_ok(res));
  EXPECT_NE(res[0].output.find("step 2: non-finite"), std::string::npos) << res[0].output;
  auto m = metrics(dir / "run");
  ASSERT_EQ(m.size(), 4u);
  for (size_t k = 0; k < m.size(); ++k) EXPECT_EQ(m[k].at("skipped").get<bool>(), k == 1) << "step " << k + 1;
  EXPECT_TRUE(std::isfinite(m[2].at("loss").get<double>()));  // the model was not poisoned
  auto tj = trainer_json(dir / "run/step-00000004");
  EXPECT_EQ(tj["state"]["step"], 4);
  EXPECT_EQ(tj["state"]["optimizer_steps"], 3);  // one update skipped, on both ranks alike
  EXPECT_EQ(tj["state"]["bad_steps"], 1);
}

TEST_F(TrainFaults, TooManyNonFiniteStepsStopEveryRankPromptly) {
  TempDir dir("badsteps");
  auto res = vlm::test::run_ranks(2, argv(dir, 4, {"--set", "optim.max_bad_steps=1"}), std::chrono::seconds(180),
                                {"VLMTRAIN_FAULT_NONFINITE=2:0"});
  for (const auto& r : res) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_FALSE(r.timed_out);
    EXPECT_LT(r.seconds, 50.0) << "rank " << r.rank << " waited for the collective timeout";
    EXPECT_NE(r.output.find("consecutive non-finite steps (optim.max_bad_steps = 1)"), std::string::npos) << r.output;
  }
}

TEST_F(TrainFaults, SigtermWritesAResumableCheckpointAndExitsZero) {
  TempDir dir("sigterm");
  const std::string log = dir / "log.txt";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    auto a = argv(dir, 400);
    std::vector<char*> args;
    for (auto& s : a) args.push_back(s.data());
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  // Wait for two logged steps, then ask it to stop.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (metrics(dir / "run").size() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(metrics(dir / "run").size(), 2u) << vlm::test::read_file(log);
  ::kill(pid, SIGTERM);
  int status = 0;
  const auto stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < stop_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "no exit within 60 s of SIGTERM\n" << vlm::test::read_file(log);
  }
  ASSERT_TRUE(WIFEXITED(status)) << vlm::test::read_file(log);
  EXPECT_EQ(WEXITSTATUS(status), 0) << vlm::test::read_file(log);
  const int64_t stopped_at = metrics(dir / "run").back().at("step").get<int64_t>();
  EXPECT_LT(stopped_at, 400);
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(stopped_at));
  const std::string ckpt = dir / ("run/" + std::string(name));
  ASSERT_TRUE(fs::exists(ckpt + "/COMPLETE")) << vlm::test::read_file(log);
  // The next run picks it up and finishes.
  auto res = vlm::test::run(argv(dir, static_cast<int>(stopped_at) + 2), std::chrono::seconds(120));
  ASSERT_EQ(res.exit_code, 0) << res.output;
  EXPECT_NE(res.output.find("resumed from " + ckpt), std::string::npos) << res.output;
  EXPECT_EQ(metrics(dir / "run").back().at("step").get<int64_t>(), stopped_at + 2);
}

// A rank dies while the step-4 checkpoint is being written: every rank exits non-zero
// (none hangs), step-2 stays the newest complete checkpoint, and the next run resumes
// from it and logs exactly the losses of an uninterrupted run.
TEST_F(TrainFaults, RankKilledDuringCheckpointSaveKeepsThePreviousOne) {
  TempDir dir("killsave"), ref("killsave-ref");
  auto args = [&](const TempDir& d) { return vlm::test::tiny_train_args(d / "run", g_data->path(), 6, 2); };
  auto res = vlm::test::run_ranks(2, args(dir), std::chrono::seconds(180), {"VLMTRAIN_FAULT_EXIT_IN_SAVE=4:1"});
  for (const auto& r : res) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_FALSE(r.timed_out) << r.output;
  }
  EXPECT_FALSE(fs::exists(dir / "run/step-00000004/COMPLETE"));
  ASSERT_TRUE(fs::exists(dir / "run/step-00000002/COMPLETE"));
  auto again = vlm::test::run_ranks(2, args(dir), std::chrono::seconds(180));
  ASSERT_TRUE(vlm::test::all_ok(again));
  EXPECT_NE(again[0].output.find("resumed from " + (dir / "run/step-00000002")), std::string::npos) << again[0].output;
  ASSERT_TRUE(vlm::test::all_ok(vlm::test::run_ranks(2, args(ref), std::chrono::seconds(180))));
  EXPECT_EQ(vlm::test::losses_by_step(dir / "run"), vlm::test::losses_by_step(ref / "run"));
}

}  // namespace
