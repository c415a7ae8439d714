// Command-line front end: subcommand table, --help texts, small argument parser.
//
// Each subcommand lives in its own file app/cmd_<name>.cpp and exposes
// `int cmd_<name>(Args&)` (declared in app/commands.h). This file only dispatches.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace vlmtrain {

// Parsed command line of one subcommand: positionals and --flag / --flag=value /
// --flag value options. Every option a command reads is consumed; finish() rejects
// the rest, so a typo never passes silently.
class Args {
 public:
  Args(std::string command, std::vector<std::string> argv);

  const std::string& command() const { return command_; }
  // The arguments as given (for commands that pass a tail through, like `launch`).
  const std::vector<std::string>& raw() const { return raw_; }
  // Positional arguments in order (everything not starting with "--").
  const std::vector<std::string>& positionals() const { return positionals_; }
  std::string positional(size_t i, const std::string& what) const;  // throws if missing

  // --name VALUE or --name=VALUE; nullopt when absent. Repeated -> last wins.
  std::optional<std::string> value(const std::string& name);
  // All values of a repeatable option (--data a --data b).
  std::vector<std::string> values(const std::string& name);
  // --name (no value).
  bool flag(const std::string& name);
  std::optional<long long> integer(const std::string& name);
  std::optional<double> number(const std::string& name);

  // Throws naming every option given but never read.
  void finish() const;

 private:
  std::string command_;
  std::vector<std::string> raw_;
  std::vector<std::string> positionals_;
  std::vector<size_t> positional_pos_;  // argv position of each positional (keeps order)
  struct Opt {
    std::optional<std::string> value;
    size_t value_pos = 0;                // argv position of the value token
    bool separate = false;               // value was the next token (not --name=value)
  };
  std::multimap<std::string, Opt> options_;
  std::map<std::string, bool> used_;
};

// Runs `vlmtrain <args>`; returns the process exit code. Throws vlm::Error on bad input.
int run_cli(int argc, char** argv);

// Records a fatal error for a launcher (TORCHELASTIC_ERROR_FILE when set). Never throws.
void report_fatal(const std::string& message);

}  // namespace vlmtrain
