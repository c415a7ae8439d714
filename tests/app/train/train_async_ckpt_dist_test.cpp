// checkpoint.async through the vlmtrain binary (real processes, Gloo over loopback, hard
// timeouts), tiny recipe on CPU, fp32:
//   - an asynchronous run logs the same losses as a synchronous one, its checkpoints hold the
//     same tensors (every rank file, every key) and trainer state, and a resume from its
//     step-3 checkpoint logs exactly the uninterrupted run's losses (world 1);
//   - with LoRA dropout 0.1 (masks from the CPU generator, so the checkpoint's rng/cpu
//     matters: resumed without it, step 4 is 3.7e-4 relative off), a resume from an
//     asynchronous checkpoint is bit-exact too (tests/app/train/checkpoint_cuda_test.cpp does
//     the same on CUDA, with rng/cuda);
//   - two ranks, one of which writes slowly (VLMTRAIN_FAULT_SLOW_SAVE): the run ends, both
//     ranks commit the same checkpoints at the same points, and files and losses equal the
//     synchronous world-2 run's;
//   - a rank killed while its asynchronous write is in flight (VLMTRAIN_FAULT_SLOW_SAVE +
//     VLMTRAIN_FAULT_EXIT): the previous checkpoint stays complete, the interrupted one has no
//     COMPLETE (it is still .step-N.tmp), and the next run resumes from the previous one onto
//     the uninterrupted loss curve;
//   - SIGTERM while a write is in flight: the stop's checkpoint waits for it, is complete
//     itself, and the process exits 0 with no temp directory left.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "app/train/checkpoint.h"
#include "tests/app/train/train_testing.h"
#include "tests/dist_testing.h"
#include "tests/testing.h"
#include "vlm/io/safetensors.h"

namespace fs = std::filesystem;
using vlm::test::TempDir;

namespace {

TempDir* g_async_data = nullptr;
TempDir* g_async_ref2 = nullptr;  // the synchronous world-2 run of 6 steps (two tests compare with it)

class TrainAsyncCkpt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_async_data = new TempDir("async-data");
    vlm::test::make_synth_data(g_async_data->path(), 48, 13);
  }
  static void TearDownTestSuite() {
    delete g_async_ref2;
    delete g_async_data;
    g_async_ref2 = nullptr;
    g_async_data = nullptr;
  }
  // The tiny recipe, 6 steps, a checkpoint every `every` steps (none pruned), on `world` ranks.
  static std::vector<vlm::test::WorkerResult> train(int world, const std::string& run_dir, int every, bool async,
                                                    const std::vector<std::string>& env = {},
                                                    const std::vector<std::string>& sets = {}) {
    auto args = vlm::test::tiny_train_args(run_dir, g_async_data->path(), 6, every);
    args.insert(args.end(), {"--set", "checkpoint.keep_last=10", "--set",
                             std::string("checkpoint.async=") + (async ? "true" : "false")});
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    return vlm::test::run_ranks(world, args, std::chrono::seconds(240), env);
  }
  // The synchronous world-2 reference, checkpoints every 2 steps (run once).
  static std::string reference_w2() {
    if (g_async_ref2 == nullptr) {
      g_async_ref2 = new TempDir("async-ref2");
      auto res = train(2, *g_async_ref2 / "run", 2, false);
      EXPECT_TRUE(vlm::test::all_ok(res));
    }
    return *g_async_ref2 / "run";
  }
};

std::string async_step_dir(const std::string& run, int64_t step) { return vlm::app::checkpoint_dir(run, step); }

// Every tensor and header of every rank file, and the trainer state but its wall time, equal.
void expect_same_checkpoint_files(const std::string& got, const std::string& want) {
  vlm::app::CheckpointReader a(got), b(want);
  ASSERT_EQ(a.world_size(), b.world_size());
  for (const auto& f : b.trainer_json().at("files")) {
    const std::string name = f.get<std::string>();
    auto fa = vlm::SafetensorsFile::open(got + "/" + name), fb = vlm::SafetensorsFile::open(want + "/" + name);
    ASSERT_EQ(fa.names(), fb.names()) << name;
    for (const auto& key : fb.names()) EXPECT_TRUE(torch::equal(fa.get(key), fb.get(key))) << got << " " << name << ": " << key;
    EXPECT_EQ(fa.metadata(), fb.metadata()) << name;
  }
  auto sa = a.trainer_json().at("state"), sb = b.trainer_json().at("state");
  sa.erase("train_seconds");
  sb.erase("train_seconds");
  EXPECT_EQ(sa, sb) << got;
}

// The "checkpoint <dir> complete: ..., committed <when>," lines of one rank's log, as
// "<dir> | <when>".
std::vector<std::string> commit_lines(const std::string& output) {
  static const std::regex re(R"(checkpoint (\S+) complete: written in the background, committed ([^,]+),)");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1].str() + " | " + (*it)[2].str());
  return out;
}

// Copies the run's checkpoints of steps <= upto and its metrics lines of those steps.
void copy_async_run_until(const std::string& from, const std::string& to, int64_t upto) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && std::stoll(name.substr(5)) <= upto)
      fs::copy(e.path(), fs::path(to) / name, fs::copy_options::recursive);
  }
  std::ifstream in(from + "/metrics.jsonl");
  std::ofstream out(to + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (nlohmann::json::parse(line).at("step").get<int64_t>() <= upto) out << line << "\n";
}

TEST_F(TrainAsyncCkpt, SameFilesAndLossesAsSyncAndBitExactResume) {
  TempDir dir("async-w1");
  auto sync = train(1, dir / "sync", 3, false);
  ASSERT_TRUE(vlm::test::all_ok(sync));
  auto async = train(1, dir / "async", 3, true);
  ASSERT_TRUE(vlm::test::all_ok(async));
  EXPECT_NE(async[0].output.find("being written in the background"), std::string::npos) << async[0].output;
  EXPECT_EQ(commit_lines(async[0].output).size(), 2u) << async[0].output;
  const auto want = vlm::test::losses_by_step(dir / "sync");
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(vlm::test::losses_by_step(dir / "async"), want);  // saving in the background changes no step
  for (int64_t step : {3, 6}) expect_same_checkpoint_files(async_step_dir(dir / "async", step), async_step_dir(dir / "sync", step));

  // Resume from the asynchronous step-3 checkpoint: steps 4-6 bit for bit.
  copy_async_run_until(dir / "async", dir / "resumed", 3);
  auto res = train(1, dir / "resumed", 3, true);
  ASSERT_TRUE(vlm::test::all_ok(res));
  EXPECT_NE(res[0].output.find("resumed from " + async_step_dir(dir / "resumed", 3)), std::string::npos)
      << res[0].output;
  EXPECT_NE(res[0].output.find("RNG states restored: rng/cpu"), std::string::npos) << res[0].output;
  EXPECT_EQ(vlm::test::losses_by_step(dir / "resumed"), want);
}

TEST_F(TrainAsyncCkpt, ResumeWithLoraDropoutIsBitExact) {
  TempDir dir("async-dropout");
  const std::vector<std::string> lora = {"sharding.default=freeze", "sharding.module.2.policy=lora",
                                         "sharding.module.2.dropout=0.1"};
  ASSERT_TRUE(vlm::test::all_ok(train(1, dir / "full", 3, true, {}, lora)));
  const auto want = vlm::test::losses_by_step(dir / "full");
  ASSERT_EQ(want.size(), 6u);
  copy_async_run_until(dir / "full", dir / "resumed", 3);
  auto res = train(1, dir / "resumed", 3, true, {}, lora);
  ASSERT_TRUE(vlm::test::all_ok(res));
  EXPECT_NE(res[0].output.find("RNG states restored: rng/cpu"), std::string::npos) << res[0].output;
  EXPECT_EQ(vlm::test::losses_by_step(dir / "resumed"), want);
}

TEST_F(TrainAsyncCkpt, TwoRanksAgreeWhileOneWritesSlowly) {
  const std::string ref = reference_w2();
  TempDir dir("async-w2");
  // Rank 1 takes 1.5 s longer over each write: at the step ends after a save rank 0 is done
  // and rank 1 is not, and both must still commit at the same point.
  auto res = train(2, dir / "run", 2, true, {"VLMTRAIN_FAULT_SLOW_SAVE=1500:1"}, {"log.all_ranks=true"});
  ASSERT_TRUE(vlm::test::all_ok(res));
  const auto c0 = commit_lines(res[0].output), c1 = commit_lines(res[1].output);
  EXPECT_EQ(c0.size(), 3u) << res[0].output;
  EXPECT_EQ(c0, c1) << "rank 0:\n" << res[0].output << "\nrank 1:\n" << res[1].output;
  EXPECT_EQ(vlm::test::losses_by_step(dir / "run"), vlm::test::losses_by_step(ref));
  for (int64_t step : {2, 4, 6}) expect_same_checkpoint_files(async_step_dir(dir / "run", step), async_step_dir(ref, step));
  for (const auto& e : fs::directory_iterator(dir / "run"))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();  // every write committed
}

TEST_F(TrainAsyncCkpt, AKillDuringAWriteKeepsTheLastCompleteCheckpoint) {
  const std::string ref = reference_w2();
  TempDir dir("async-kill");
  // Rank 1's writes take 2 s; it dies before step 5, while its write of step 4 is in flight
  // (step 2's was committed when step 4's save began).
  auto res = train(2, dir / "run", 2, true, {"VLMTRAIN_FAULT_SLOW_SAVE=2000:1", "VLMTRAIN_FAULT_EXIT=5:1"});
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[1].exit_code, 3) << res[1].output;
  EXPECT_NE(res[0].exit_code, 0) << res[0].output;
  EXPECT_FALSE(res[0].timed_out) << res[0].output;
  EXPECT_EQ(vlm::app::complete_checkpoints(dir / "run"), (std::vector<std::string>{async_step_dir(dir / "run", 2)}));
  EXPECT_FALSE(fs::exists(async_step_dir(dir / "run", 4)));
  EXPECT_TRUE(fs::is_directory(dir / "run/.step-00000004.tmp"));
  EXPECT_FALSE(fs::exists(dir / "run/.step-00000004.tmp/COMPLETE"));
  EXPECT_FALSE(fs::exists(dir / "run/.step-00000004.tmp/state-rank00001-of-00002.safetensors"));
  expect_same_checkpoint_files(async_step_dir(dir / "run", 2), async_step_dir(ref, 2));

  // The next run resumes from step 2 and follows the uninterrupted curve bit for bit.
  auto again = train(2, dir / "run", 2, true);
  ASSERT_TRUE(vlm::test::all_ok(again));
  EXPECT_NE(again[0].output.find("resumed from " + async_step_dir(dir / "run", 2)), std::string::npos)
      << again[0].output;
  EXPECT_EQ(vlm::test::losses_by_step(dir / "run"), vlm::test::losses_by_step(ref));
  EXPECT_EQ(vlm::app::complete_checkpoints(dir / "run").size(), 3u);
}

TEST_F(TrainAsyncCkpt, SigtermWaitsForTheWriteInFlight) {
  TempDir dir("async-sigterm");
  const std::string log = dir / "log.txt", run = dir / "run";
  auto args = vlm::test::tiny_train_args(run, g_async_data->path(), 400, 1);  // a save every step
  args.insert(args.end(), {"--set", "checkpoint.async=true", "--set", "checkpoint.keep_last=2"});
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("VLMTRAIN_FAULT_SLOW_SAVE", "1000", 1);  // each write takes 1 s longer: always one in flight
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> a;
    for (auto& s : args) a.push_back(s.data());
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (vlm::test::metrics_lines(run).size() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(vlm::test::metrics_lines(run).size(), 2u) << vlm::test::read_file(log);
  ::kill(pid, SIGTERM);
  int status = 0;
  pid_t done = 0;
  const auto stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < stop_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "no exit within 60 s of SIGTERM\n" << vlm::test::read_file(log);
  }
  const std::string out = vlm::test::read_file(log);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  const int64_t stopped_at = vlm::test::metrics_lines(run).back().at("step").get<int64_t>();
  EXPECT_LT(stopped_at, 400);
  const auto complete = vlm::app::complete_checkpoints(run);
  ASSERT_FALSE(complete.empty()) << out;
  EXPECT_EQ(complete.back(), async_step_dir(run, stopped_at)) << out;
  EXPECT_NE(out.find("committed before stopping"), std::string::npos) << out;
  for (const auto& e : fs::directory_iterator(run))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path() << "\n" << out;
}

}  // namespace
