// Command-line front end: the subcommand table, one CLI11 App per subcommand, and the
// helpers every app/cmd_<name>.cpp uses to declare its options.
//
// Each subcommand file defines `CommandRun declare_<name>(CLI::App&)` (app/cli/commands.h):
// it declares the command's positionals and options on the App (bound to the fields of a
// typed struct of its own), sets the help prose (description: usage lines and what the
// command does; footer: notes after the option list), and returns the function that runs
// the command with the parsed values. `vlmtrain <cmd> --help` is generated from that.
//
// Parse errors are vlm::Error in the project's style, caught in main: "vlmtrain eval:
// unknown option(s) --max-new-token (did you mean --max-new-tokens?); see `vlmtrain eval
// --help`", "vlmtrain plan: --world-size expects an integer, got 'abc'; see ...".
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace vlm::app {

// Runs a subcommand with the values its App was parsed into; returns the exit code.
using CommandRun = std::function<int()>;

// A subcommand's App with its options declared, and what runs it once parsed.
struct CommandApp {
  std::unique_ptr<CLI::App> app;
  CommandRun run;
};

// The subcommands, in the order `vlmtrain --help` lists them.
std::vector<std::string> command_names();

// An App named `name` ("vlmtrain eval") with the project's conventions: unknown arguments
// kept for parse_command's checks, a repeated option keeps its last value, --help/-h, and
// the help layout (description, positionals, option groups, footer).
std::unique_ptr<CLI::App> make_app(const std::string& name);

// Builds `vlmtrain <name>`'s App. Throws vlm::Error for an unknown name.
CommandApp make_command(const std::string& name);

// Parses `args` (the arguments after the command name) into `app`. Returns false when
// --help was asked for (the help is then printed on stdout). Throws vlm::Error on bad
// input: unknown options (with the closest known spelling), values of the wrong type,
// missing or unexpected positionals, a value given to a flag.
bool parse_command(CLI::App& app, const std::vector<std::string>& args);

// The candidate closest to `word` (edit distance with transpositions) when close enough
// to be a likely typo, else "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

// ---------------------------------------------------------------- declaring options

namespace cli_detail {
template <class T> struct Unwrap { using type = T; };
template <class T> struct Unwrap<std::optional<T>> { using type = T; };
template <class T> struct Unwrap<std::vector<T>> { using type = T; };
template <class T> inline constexpr bool kIsVector = false;
template <class T> inline constexpr bool kIsVector<std::vector<T>> = true;

// Rejects (with a message naming the option) a value that is not a decimal integer, and
// writes it back in canonical form (CLI11 would read "010" as octal).
CLI::Validator integer_value(const std::string& option);
// Rejects a value that is not a number (strtod syntax).
CLI::Validator number_value(const std::string& option);
}  // namespace cli_detail

// Declares `--name VALUE` (or `--name=VALUE`; repeated: the last wins, or every one for a
// std::vector target) bound to `target`: std::string, an integer, double, or
// std::optional / std::vector of them (an optional stays empty when the option is absent).
// `metavar` names the value in the help (N, DIR, FILE.jsonl).
template <class T>
CLI::Option* add_value(CLI::App& app, const std::string& name, T& target, const std::string& metavar,
                       const std::string& help) {
  using V = typename cli_detail::Unwrap<T>::type;
  CLI::Option* opt = app.add_option(name, target, help)->type_name(metavar);
  const std::string shown = opt->get_name();
  if constexpr (std::is_integral_v<V>) opt->transform(cli_detail::integer_value(shown));
  if constexpr (std::is_floating_point_v<V>) opt->check(cli_detail::number_value(shown));
  if constexpr (cli_detail::kIsVector<T>) {
    opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    // One value per --name (CLI11 would let a vector option take every following token).
    if (opt->nonpositional()) opt->allow_extra_args(false);
  }
  return opt;
}

// Declares `--name` (no value; `--name=VALUE` is an error) setting `target` to true.
CLI::Option* add_flag(CLI::App& app, const std::string& name, bool& target, const std::string& help);

// The RECIPE positional and the repeatable `--set KEY=VALUE` of the commands that read a
// recipe; load with load_recipe(args.path, args.sets) (app/config/recipe.h).
struct RecipeArgs {
  std::string path;               // RECIPE (a .toml file); "" when optional and absent
  std::vector<std::string> sets;  // --set KEY=VALUE, in order
};
void add_recipe(CLI::App& app, RecipeArgs& args, bool required = true);

// ---------------------------------------------------------------- entry points

// Runs `vlmtrain <args>`; returns the process exit code. Throws vlm::Error on bad input.
int run_cli(int argc, char** argv);

// Records a fatal error for a launcher (TORCHELASTIC_ERROR_FILE when set). Never throws.
void report_fatal(const std::string& message);

}  // namespace vlm::app
