#include "tests/dist_testing.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tests/testing.h"

extern char** environ;

namespace vlm::test {

bool is_dist_worker() {
  const char* v = std::getenv("VLMTRAIN_TEST_DIST_WORKER");
  return v != nullptr && std::string(v) == "1";
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw std::runtime_error("bind(127.0.0.1:0) failed");
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

namespace {

bool is_launcher_var(const std::string& key) {
  static const char* exact[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                "GROUP_RANK", "ROLE_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
                                "MASTER_PORT", "GLOO_SOCKET_IFNAME", "VLMTRAIN_TEST_DIST_WORKER"};
  for (const char* e : exact)
    if (key == e) return true;
  return key.rfind("SLURM_", 0) == 0 || key.rfind("TORCHELASTIC_", 0) == 0;
}

std::vector<std::string> worker_env(const DistRun& run, int rank, int port) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    if (!is_launcher_var(kv.substr(0, kv.find('=')))) env.push_back(kv);
  }
  env.push_back("VLMTRAIN_TEST_DIST_WORKER=1");
  const std::string n = std::to_string(run.world_size), r = std::to_string(rank);
  if (run.style == DistRun::Style::kTorchrun) {
    for (const std::string& kv : std::vector<std::string>{"RANK=" + r, "WORLD_SIZE=" + n, "LOCAL_RANK=" + r, "LOCAL_WORLD_SIZE=" + n,
          "GROUP_RANK=0", std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port)})
      env.push_back(kv);
  } else if (run.style == DistRun::Style::kSlurm) {
    for (const std::string& kv : std::vector<std::string>{"SLURM_PROCID=" + r, "SLURM_NTASKS=" + n, "SLURM_LOCALID=" + r, "SLURM_NODEID=0",
          "SLURM_TASKS_PER_NODE=" + n, std::string("SLURM_JOB_NODELIST=localhost"),
          "MASTER_PORT=" + std::to_string(port)})
      env.push_back(kv);
  }
  if (run.extra_env)
    for (const auto& kv : run.extra_env(rank)) env.push_back(kv);
  return env;
}

}  // namespace

namespace {

std::vector<WorkerResult> run_workers_once(const DistRun& run, int port) {
  TempDir logs("dist");
  const std::string exe = "/proc/self/exe";
  char self[4096];
  ssize_t len = ::readlink(exe.c_str(), self, sizeof self - 1);
  if (len <= 0) throw std::runtime_error("readlink(/proc/self/exe) failed");
  self[len] = 0;

  std::vector<WorkerResult> results(run.world_size);
  std::vector<pid_t> pids(run.world_size, -1);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < run.world_size; ++r) {
    results[r].rank = r;
    // Build everything the child needs before fork (no allocation after fork).
    std::vector<std::string> env = worker_env(run, r, port);
    std::vector<std::string> argv = {self, "--gtest_filter=" + run.worker_test,
                                     "--gtest_also_run_disabled_tests", "--gtest_color=no"};
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    const std::string log = logs / ("rank" + std::to_string(r) + ".log");
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open " + log);
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::setpgid(0, 0);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
      ::execve(cargv[0], cargv.data(), cenv.data());
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    ::close(fd);
    pids[r] = pid;
  }

  int running = run.world_size;
  std::chrono::steady_clock::time_point deadline = t0 + run.timeout;
  while (running > 0) {
    bool progressed = false;
    for (int r = 0; r < run.world_size; ++r) {
      if (pids[r] < 0) continue;
      int status = 0;
      pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got != pids[r]) continue;
      progressed = true;
      pids[r] = -1;
      --running;
      auto& res = results[r];
      res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
      else if (WIFSIGNALED(status)) res.exit_code = 128 + WTERMSIG(status);
      if (res.exit_code != 0) {
        auto grace = std::chrono::steady_clock::now() + run.grace_after_failure;
        if (grace < deadline) deadline = grace;
      }
    }
    if (running == 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      for (int r = 0; r < run.world_size; ++r) {
        if (pids[r] < 0) continue;
        ::kill(-pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        results[r].timed_out = true;
        results[r].exit_code = 124;
        results[r].seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        pids[r] = -1;
      }
      break;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < run.world_size; ++r)
    results[r].output = read_file(logs / ("rank" + std::to_string(r) + ".log"));
  return results;
}

}  // namespace

std::vector<WorkerResult> run_workers(const DistRun& run) {
  // A port picked by free_port() can be taken by someone else before rank 0 binds it
  // (parallel ctest): then rank 0 reports it cannot host the store, and we retry.
  for (int attempt = 0;; ++attempt) {
    const int port = run.master_port != 0 ? run.master_port : free_port();
    auto results = run_workers_once(run, port);
    const bool port_taken =
        results[0].exit_code != 0 &&
        results[0].output.find("cannot host the rendezvous store") != std::string::npos;
    if (!port_taken || run.master_port != 0 || attempt == 2) return results;
    std::fprintf(stderr, "run_workers: port %d was taken, retrying with another\n", port);
  }
}

::testing::AssertionResult all_ok(const std::vector<WorkerResult>& results) {
  bool ok = !results.empty();
  for (const auto& r : results) ok = ok && r.exit_code == 0;
  if (ok) return ::testing::AssertionSuccess();
  std::ostringstream ss;
  ss << results.size() << " workers, not all exited 0:\n";
  for (const auto& r : results) {
    ss << "---- rank " << r.rank << ": exit " << r.exit_code
       << (r.timed_out ? " (killed: timeout)" : "") << " after " << r.seconds << " s\n"
       << r.output << "\n";
  }
  return ::testing::AssertionFailure() << ss.str();
}

std::vector<WorkerResult> run_ranks(int world, const std::vector<std::string>& argv,
                                    std::chrono::seconds timeout, const std::vector<std::string>& extra_env) {
  for (int attempt = 0;; ++attempt) {
    const int port = free_port();
    std::vector<WorkerResult> results(static_cast<size_t>(world));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        std::vector<std::string> env = extra_env;
        if (world > 1) {
          for (const std::string& kv :
               {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world), "LOCAL_RANK=" + std::to_string(r),
                "LOCAL_WORLD_SIZE=" + std::to_string(world), std::string("MASTER_ADDR=127.0.0.1"),
                "MASTER_PORT=" + std::to_string(port)})
            env.push_back(kv);
        }
        const auto t0 = std::chrono::steady_clock::now();
        RunResult rr = run(argv, timeout, env);
        WorkerResult& w = results[static_cast<size_t>(r)];
        w.rank = r;
        w.exit_code = rr.exit_code;
        w.timed_out = rr.timed_out;
        w.output = std::move(rr.output);
        w.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      });
    for (auto& t : threads) t.join();
    const bool port_taken = world > 1 && results[0].exit_code != 0 &&
                            results[0].output.find("cannot host the rendezvous store") != std::string::npos;
    if (!port_taken || attempt >= 3) return results;
  }
}

}  // namespace vlm::test
