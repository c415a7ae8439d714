#include "app/cli.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "app/commands.h"
#include "vlm/check.h"
#include "vlm/runtime_info.h"

#include <nlohmann/json.hpp>

namespace vlmtrain {

// ---------------------------------------------------------------- Args

Args::Args(std::string command, std::vector<std::string> argv)
    : command_(std::move(command)), raw_(argv) {
  auto add_positional = [&](size_t pos) {
    positionals_.push_back(argv[pos]);
    positional_pos_.push_back(pos);
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--") {  // everything after is positional
      for (++i; i < argv.size(); ++i) add_positional(i);
      break;
    }
    if (a.rfind("--", 0) == 0 && a.size() > 2) {
      auto eq = a.find('=');
      if (eq != std::string::npos) {
        options_.emplace(a.substr(2, eq - 2), Opt{a.substr(eq + 1), i});
      } else if (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) {
        // Value or flag followed by a positional: decided when the command reads it.
        options_.emplace(a.substr(2), Opt{argv[i + 1], i + 1, true});
        ++i;
      } else {
        options_.emplace(a.substr(2), Opt{std::nullopt, i});
      }
    } else {
      add_positional(i);
    }
  }
}

std::string Args::positional(size_t i, const std::string& what) const {
  VLM_CHECK(i < positionals_.size(), "vlmtrain ", command_, ": missing ", what,
            " (see `vlmtrain ", command_, " --help`)");
  return positionals_[i];
}

std::optional<std::string> Args::value(const std::string& name) {
  auto range = options_.equal_range(name);
  if (range.first == range.second) return std::nullopt;
  used_[name] = true;
  std::optional<std::string> last;
  for (auto it = range.first; it != range.second; ++it) last = it->second.value;
  VLM_CHECK(last.has_value(), "vlmtrain ", command_, ": option --", name, " needs a value");
  return last;
}

std::vector<std::string> Args::values(const std::string& name) {
  std::vector<std::string> out;
  auto range = options_.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) {
    VLM_CHECK(it->second.value.has_value(), "vlmtrain ", command_, ": option --", name,
              " needs a value");
    out.push_back(*it->second.value);
  }
  if (!out.empty()) used_[name] = true;
  return out;
}

bool Args::flag(const std::string& name) {
  auto it = options_.find(name);
  if (it == options_.end()) return false;
  used_[name] = true;
  VLM_CHECK(it->second.separate || !it->second.value.has_value(), "vlmtrain ", command_,
            ": option --", name, " takes no value");
  if (it->second.value.has_value()) {
    // "--json FILE": the token after a flag was a positional; put it back in its place.
    size_t pos = it->second.value_pos;
    size_t at = std::upper_bound(positional_pos_.begin(), positional_pos_.end(), pos) -
                positional_pos_.begin();
    positionals_.insert(positionals_.begin() + at, *it->second.value);
    positional_pos_.insert(positional_pos_.begin() + at, pos);
    it->second.value.reset();
  }
  return true;
}

std::optional<long long> Args::integer(const std::string& name) {
  auto v = value(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v->c_str(), &end, 10);
  VLM_CHECK(errno == 0 && end != v->c_str() && *end == '\0', "vlmtrain ", command_, ": --", name,
            " expects an integer, got '", *v, "'");
  return x;
}

std::optional<double> Args::number(const std::string& name) {
  auto v = value(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  VLM_CHECK(end != v->c_str() && *end == '\0', "vlmtrain ", command_, ": --", name,
            " expects a number, got '", *v, "'");
  return x;
}

void Args::finish() const {
  std::string unknown;
  for (const auto& [k, v] : options_)
    if (!used_.count(k)) unknown += (unknown.empty() ? "--" : ", --") + k;
  VLM_CHECK(unknown.empty(), "vlmtrain ", command_, ": unknown option(s) ", unknown,
            " (see `vlmtrain ", command_, " --help`)");
}

// ---------------------------------------------------------------- commands

namespace {

struct Command {
  const char* name;
  const char* summary;
  const char* (*help)();
  int (*run)(Args&);
};

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
    {"train", "Train a model from a recipe (also: vlmtrain RECIPE)", &help_train, &cmd_train},
    {"eval", "Evaluate a checkpoint or HF model on OCR sets", &help_eval, &cmd_eval},
    {"plan", "Print the module/unit table and memory per rank (no weights needed)", &help_plan, &cmd_plan},
    {"export", "Write a consolidated HF directory from a checkpoint", &help_export, &cmd_export},
    {"score", "Score an existing predictions.jsonl (no model needed)", &help_score, &cmd_score},
    {"synth-ocr", "Render a synthetic OCR dataset (+ a small sentencepiece model)", &help_synth_ocr, &cmd_synth_ocr},
    {"inspect", "Inspect a dataset or an image as the pipeline sees it", &help_inspect, &cmd_inspect},
    {"tokenize", "Encode or decode text with a tokenizer (debugging / conformance)", &help_tokenize, &cmd_tokenize},
    {"launch", "Spawn N workers with the torchrun environment (no Python needed)", &help_launch, &cmd_launch},
    {"report", "Render curves and a summary page from a run directory", &help_report, &cmd_report},
  };
  return table;
}

void print_usage(FILE* out) {
  std::fprintf(out,
               "vlmtrain %s: fine-tune vision-language models (Qwen2-VL, Qwen2.5-VL)\n\n"
               "usage: vlmtrain RECIPE.toml [--set KEY=VALUE]...   (same as `vlmtrain train`)\n"
               "       vlmtrain COMMAND [ARGS] [--help]\n\ncommands:\n",
               VLMTRAIN_VERSION);
  for (const auto& c : commands()) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "\nRun `vlmtrain COMMAND --help` for a command's options.\n");
}

bool is_help(const std::string& a) { return a == "--help" || a == "-h" || a == "help"; }

}  // namespace

Recipe recipe_from_args(Args& args, size_t index) {
  std::string path = args.positional(index, "RECIPE (a .toml file)");
  return load_recipe(path, args.values("set"));
}

[[noreturn]] void not_yet(const std::string& command, const std::string& issue) {
  throw vlm::Error("`vlmtrain " + command + "` is not implemented yet (tracked in " + issue +
                   "); see `vlmtrain --help` for what works today");
}

int run_cli(int argc, char** argv) {
  std::vector<std::string> rest(argv + 1, argv + argc);
  if (rest.empty() || is_help(rest[0])) {
    print_usage(rest.empty() ? stderr : stdout);
    return rest.empty() ? 2 : 0;
  }
  if (rest[0] == "--version") {
    std::printf("%s\n", vlm::version_line(vlm::runtime_info()).c_str());
    return 0;
  }
  std::string name = rest[0];
  std::vector<std::string> cmd_args(rest.begin() + 1, rest.end());
  const Command* cmd = nullptr;
  for (const auto& c : commands())
    if (name == c.name) cmd = &c;
  if (cmd == nullptr) {
    // `vlmtrain RECIPE.toml ...` is `vlmtrain train RECIPE.toml ...`.
    bool looks_like_recipe = name.size() > 5 && name.substr(name.size() - 5) == ".toml";
    if (!looks_like_recipe) {
      std::string hint;
      for (const auto& c : commands())
        if (std::string(c.name).rfind(name.substr(0, 2), 0) == 0) hint = c.name;
      throw vlm::Error("unknown command '" + name + "'" +
                       (hint.empty() ? "" : " (did you mean `" + hint + "`?)") +
                       "; run `vlmtrain --help` for the list, or pass a recipe file (*.toml) "
                       "to train");
    }
    for (const auto& c : commands())
      if (std::string(c.name) == "train") cmd = &c;
    cmd_args = rest;
  }
  // `launch` passes its worker's arguments through (their --help is the worker's).
  for (const auto& a : std::string(cmd->name) == "launch" ? std::vector<std::string>() : cmd_args) {
    if (is_help(a) && a != "help") {
      std::fputs(cmd->help(), stdout);
      return 0;
    }
  }
  Args args(cmd->name, cmd_args);
  return cmd->run(args);
}

void report_fatal(const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  try {
    auto now = std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
    nlohmann::json j = {{"message", message}, {"timestamp", now}};
    std::ofstream f(path);
    f << j.dump() << "\n";
  } catch (...) {
  }
}

}  // namespace vlmtrain
