#include "app/cli/cli.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "app/cli/commands.h"
#include "vlm/families/registry.h"
#include "vlm/runtime/check.h"
#include "vlm/runtime/runtime_info.h"

#include <nlohmann/json.hpp>

namespace vlm::app {

// ---------------------------------------------------------------- help layout

namespace {

// Help as the project has always printed it: the description (usage lines and prose),
// the positionals and the options of each group with their metavars, then the footer.
// CLI11's own "Usage:" line is left out (the description starts with the usage lines),
// and so is the list of subcommands (`inspect` describes its two in the prose); one blank
// line between sections.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() {
    column_width(24);
    label("Positionals", "arguments");
    label("REQUIRED", "(required)");
  }
  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode) const override {
    std::string out = app->get_description() + make_positionals(app);
    for (const std::string& group : app->get_groups()) {
      const auto opts = app->get_options(
          [&](const CLI::Option* o) { return o->get_group() == group && o->nonpositional(); });
      if (!opts.empty()) out += make_group(group, false, opts);
    }
    if (!app->get_footer().empty()) out += "\n" + app->get_footer() + "\n";
    return out;
  }
};

// "vlmtrain inspect image" for the App of `inspect image`.
std::string full_name(const CLI::App* app) {
  std::string name = app->get_name();
  for (const CLI::App* p = app->get_parent(); p != nullptr; p = p->get_parent()) name = p->get_name() + " " + name;
  return name;
}

}  // namespace

// ---------------------------------------------------------------- declaring options

namespace cli_detail {

CLI::Validator integer_value(const std::string& option) {
  return CLI::Validator(
      [option](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(v.c_str(), &end, 10);
        if (errno != 0 || end == v.c_str() || *end != '\0') return option + " expects an integer, got '" + v + "'";
        v = std::to_string(x);
        return "";
      },
      "", "");
}

CLI::Validator number_value(const std::string& option) {
  return CLI::Validator(
      [option](std::string& v) -> std::string {
        char* end = nullptr;
        std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end != '\0') return option + " expects a number, got '" + v + "'";
        return "";
      },
      "", "");
}

}  // namespace cli_detail

CLI::Option* add_flag(CLI::App& app, const std::string& name, bool& target, const std::string& help) {
  return app.add_flag(name, target, help)->disable_flag_override();
}

void add_recipe(CLI::App& app, RecipeArgs& args, bool required) {
  CLI::Option* recipe = add_value(app, "RECIPE", args.path, "", "the recipe (a .toml file; recipes/ holds examples)");
  if (required) recipe->required();
  add_value(app, "--set", args.sets, "KEY=VALUE",
            "override a recipe key (TOML value syntax, e.g. --set optim.lr=2e-5,\n"
            "--set data.train='[\"a.jsonl\",\"b.jsonl\"]'); may be repeated");
}

Recipe load_recipe(const RecipeArgs& args) { return load_recipe(args.path, args.sets); }

// ---------------------------------------------------------------- did you mean

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  // Optimal string alignment distance: insertions, deletions, substitutions and swaps of
  // neighbours ("trian" -> "train") cost 1.
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i)
      for (size_t j = 1; j <= b.size(); ++j) {
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    return d[a.size()][b.size()];
  };
  std::string best;
  size_t best_d = 0;
  for (const std::string& c : candidates) {
    const size_t d = distance(word, c);
    if (best.empty() || d < best_d) best = c, best_d = d;
  }
  // A typo: at most a third of the word's letters wrong (at least 1, at most 3).
  const size_t limit = std::clamp<size_t>(word.size() / 3, 1, 3);
  return !best.empty() && best_d <= limit ? best : "";
}

// ---------------------------------------------------------------- parsing

namespace {

// Arguments CLI11 could not place: unknown options (reported with the closest known
// option) and positionals beyond the declared ones. Throws vlm::Error for the first kind
// found in the chain of parsed apps (root, then each selected subcommand).
void check_leftovers(const CLI::App& root) {
  for (const CLI::App* app = &root; app != nullptr;) {
    const std::string name = full_name(app);
    std::vector<std::string> known;
    for (const CLI::Option* o : app->get_options())
      for (const std::string& l : o->get_lnames()) known.push_back("--" + l);
    std::string unknown, unexpected;
    bool positional_only = false;
    for (const std::string& a : app->remaining()) {
      if (!positional_only && a == "--") {
        positional_only = true;
        continue;
      }
      const bool is_option = !positional_only && a.size() > 1 && a[0] == '-' &&
                             !(a[1] >= '0' && a[1] <= '9') && a[1] != '.';
      if (is_option) {
        const std::string opt = a.substr(0, a.find('='));
        const std::string hint = did_you_mean(opt, known);
        unknown += (unknown.empty() ? "" : ", ") + opt + (hint.empty() ? "" : " (did you mean " + hint + "?)");
      } else if (unexpected.empty()) {
        unexpected = a;
      }
    }
    VLM_CHECK(unknown.empty(), name, ": unknown option(s) ", unknown, "; see `", name, " --help`");
    if (!unexpected.empty()) {
      std::string expected;
      for (const CLI::App* sub : app->get_subcommands({})) expected += (expected.empty() ? "" : ", ") + sub->get_name();
      throw vlm::Error(vlm::str(name, ": unexpected argument '", unexpected, "'",
                                expected.empty() ? "" : " (expected one of: " + expected + ")", "; see `", name,
                                " --help`"));
    }
    const auto subs = app->get_subcommands();
    app = subs.empty() ? nullptr : subs.front();
  }
}

// CLI11's message for a parse error, in the project's words.
std::string describe(const CLI::ParseError& e) {
  std::string what = e.what();
  if (dynamic_cast<const CLI::ValidationError*>(&e) != nullptr) {
    // "NAME: MESSAGE"; our validators' messages name the option themselves.
    const auto colon = what.find(": ");
    if (colon != std::string::npos) what = what.substr(colon + 2);
  } else if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    const auto flag = what.find(" was given a disallowed flag override");
    const auto missing = what.find(": ");
    if (flag != std::string::npos) {
      std::string opt = what.substr(0, flag);
      if (opt.rfind("-", 0) != 0) opt = "--" + opt;
      what = opt + " takes no value";
    } else if (missing != std::string::npos && what.size() > 8 && what.substr(what.size() - 8) == " missing") {
      what = "option " + what.substr(0, missing) + " needs a value";
    }
  }
  return what;
}

}  // namespace

bool parse_command(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 pops from the back
  std::optional<std::string> error;
  const CLI::App* failed = &app;
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return false;
  } catch (const CLI::ParseError& e) {
    error = describe(e);
    for (auto subs = app.get_subcommands(); !subs.empty(); subs = subs.front()->get_subcommands())
      failed = subs.front();
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      // "RECIPE is required" -> "missing RECIPE"; a subcommand: name the choices.
      std::string choices;
      for (const CLI::App* sub : failed->get_subcommands({})) choices += (choices.empty() ? "" : ", ") + sub->get_name();
      const auto is = error->rfind(" is required");
      if (!choices.empty() && failed->get_subcommands().empty())
        error = "missing the subcommand (one of: " + choices + ")";
      else if (is != std::string::npos)
        error = "missing " + error->substr(0, is);
    }
  }
  check_leftovers(app);  // an unknown option explains most other errors: report it first
  if (error) {
    const std::string name = full_name(failed);
    throw vlm::Error(vlm::str(name, ": ", *error, "; see `", name, " --help`"));
  }
  return true;
}

// ---------------------------------------------------------------- commands

namespace {

struct Command {
  const char* name;
  const char* summary;
  CommandRun (*declare)(CLI::App&);
};

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
    {"train", "Train a model from a recipe (also: vlmtrain RECIPE)", &declare_train},
    {"eval", "Evaluate a checkpoint or HF model on OCR sets", &declare_eval},
    {"plan", "Print the module/unit table and memory per rank (no weights needed)", &declare_plan},
    {"export", "Write a consolidated HF directory from a checkpoint", &declare_export},
    {"score", "Score an existing predictions.jsonl (no model needed)", &declare_score},
    {"synth-ocr", "Render a synthetic OCR dataset (+ a small sentencepiece model)", &declare_synth_ocr},
    {"inspect", "Inspect a dataset or an image as the pipeline sees it", &declare_inspect},
    {"tokenize", "Encode or decode text with a tokenizer (debugging / conformance)", &declare_tokenize},
    {"launch", "Spawn N workers with the torchrun environment (no Python needed)", &declare_launch},
    {"report", "Render curves and a summary page from a run directory", &declare_report},
    {"recipe", "Print the recipe key reference (--doc) or a resolved recipe", &declare_recipe},
  };
  return table;
}

void print_usage(FILE* out) {
  std::string families;  // the registry's, by display name
  for (const vlm::ModelFamilySpec* f : vlm::model_families())
    families += (families.empty() ? "" : ", ") + f->display_name;
  std::fprintf(out,
               "vlmtrain %s: fine-tune vision-language models (%s)\n\n"
               "usage: vlmtrain RECIPE.toml [--set KEY=VALUE]...   (same as `vlmtrain train`)\n"
               "       vlmtrain COMMAND [ARGS] [--help]\n\ncommands:\n",
               VLMTRAIN_VERSION, families.c_str());
  for (const auto& c : commands()) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "\nRun `vlmtrain COMMAND --help` for a command's options.\n");
}

bool is_help(const std::string& a) { return a == "--help" || a == "-h" || a == "help"; }

}  // namespace

std::vector<std::string> command_names() {
  std::vector<std::string> names;
  for (const auto& c : commands()) names.push_back(c.name);
  return names;
}

std::unique_ptr<CLI::App> make_app(const std::string& name) {
  auto app = std::make_unique<CLI::App>("", name);
  app->allow_extras();
  app->formatter(std::make_shared<HelpFormatter>());
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->group("options");
  app->set_help_flag("-h,--help", "print this help and exit");
  return app;
}

CommandApp make_command(const std::string& name) {
  for (const auto& c : commands()) {
    if (name != c.name) continue;
    CommandApp cmd;
    cmd.app = make_app("vlmtrain " + name);
    cmd.run = c.declare(*cmd.app);
    return cmd;
  }
  throw vlm::Error("unknown command '" + name + "'");
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
  const std::vector<std::string> names = command_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    // `vlmtrain RECIPE.toml ...` is `vlmtrain train RECIPE.toml ...`.
    const bool looks_like_recipe = name.size() > 5 && name.substr(name.size() - 5) == ".toml";
    if (!looks_like_recipe) {
      const std::string hint = did_you_mean(name, names);
      throw vlm::Error("unknown command '" + name + "'" + (hint.empty() ? "" : " (did you mean `" + hint + "`?)") +
                       "; run `vlmtrain --help` for the list, or pass a recipe file (*.toml) to train");
    }
    name = "train";
    cmd_args = rest;
  }
  // `launch` passes its worker's command line through: it parses its own (app/launch/launcher.h).
  if (name == "launch") return cmd_launch(cmd_args);
  CommandApp cmd = make_command(name);
  if (!parse_command(*cmd.app, cmd_args)) return 0;  // --help
  return cmd.run();
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

}  // namespace vlm::app
