// The vlmtrain binary as a user runs it: help for every subcommand, clear errors.
#include <gtest/gtest.h>

#include "app/cli/cli.h"
#include "app/config/recipe.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"

namespace {

const std::vector<std::string> kCommands = {"train", "eval", "plan", "export", "score", "synth-ocr",
                                            "inspect", "tokenize", "launch", "report"};

TEST(Cli, TopLevelHelpListsEveryCommand) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const auto& c : kCommands) EXPECT_NE(r.output.find("  " + c + " "), std::string::npos) << c;
}

TEST(Cli, HelpForEachSubcommandExitsZero) {
  for (const auto& c : kCommands) {
    auto r = vlm::test::run({vlm::test::vlmtrain_bin(), c, "--help"});
    EXPECT_EQ(r.exit_code, 0) << c << ": " << r.output;
    EXPECT_NE(r.output.find("usage: vlmtrain " + c), std::string::npos) << c << ": " << r.output;
  }
}

TEST(Cli, UnknownSubcommandFailsWithHint) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "trian"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown command 'trian'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did you mean `train`"), std::string::npos) << r.output;
}

TEST(Cli, NoArgumentsPrintsUsageAndFails) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("usage:"), std::string::npos) << r.output;
}

TEST(Cli, RecipeAsFirstArgumentMeansTrain) {
  std::string recipe = vlm::test::source_dir() + "/recipes/ocr_tiny.toml";
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), recipe, "--dry-run", "--set", "optim.lr=5e-4"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("lr = 0.0005"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("preset = \"tiny\""), std::string::npos) << r.output;
}

TEST(Cli, TrainLogsAndSavesTheResolvedRecipe) {
  vlm::test::TempDir dir("cli_run");
  std::string recipe = vlm::test::source_dir() + "/recipes/ocr_tiny.toml";
  // No data (and no rendering): the run stops right after the recipe is logged and saved.
  const std::vector<std::string> sets = {"run.output_dir=" + dir.path() + "/run", "optim.lr=7e-4",
                                         "data.synth.generate_if_missing=false",
                                         "data.train=[\"" + dir.path() + "/absent.jsonl\"]"};
  std::vector<std::string> argv = {vlm::test::vlmtrain_bin(), "train", recipe};
  for (const std::string& s : sets) argv.insert(argv.end(), {"--set", s});
  auto r = vlm::test::run(argv);
  EXPECT_NE(r.output.find("lr = 0.0007"), std::string::npos) << r.output;  // printed at start
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("absent.jsonl"), std::string::npos) << r.output;
  std::string saved = vlm::test::read_file(dir.path() + "/run/recipe.toml");
  vlm::app::Recipe back = vlm::app::parse_recipe(saved, "saved.toml");
  vlm::app::Recipe orig = vlm::app::load_recipe(recipe, sets);
  EXPECT_EQ(vlm::app::recipe_hash(back), vlm::app::recipe_hash(orig));
}

TEST(Cli, BadRecipeExitsNonZeroNamingFileAndKey) {
  vlm::test::TempDir dir("cli");
  std::string path = dir / "broken.toml";
  vlm::test::write_file(path, "[model]\npreset = \"tiny\"\n[optim]\nlearning_rate = 1\n");
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "train", path, "--dry-run"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(path + ":4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("optim.learning_rate"), std::string::npos) << r.output;
}

TEST(Cli, UnknownOptionIsRejected) {
  std::string recipe = vlm::test::source_dir() + "/recipes/ocr_tiny.toml";
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "train", recipe, "--dry-runn"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown option(s) --dry-runn"), std::string::npos) << r.output;
}

}  // namespace

namespace {

// Every option and positional of a command's App and of its subcommands' Apps, with the
// help text that lists them (`vlmtrain inspect image --help`).
void expect_help_lists_options(const CLI::App& app, const std::vector<std::string>& argv) {
  std::vector<std::string> help_argv = argv;
  help_argv.push_back("--help");
  auto r = vlm::test::run(help_argv);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames())
      EXPECT_NE(r.output.find("--" + l), std::string::npos) << argv.back() << ": --" << l << "\n" << r.output;
    if (o->get_positional()) {
      EXPECT_NE(r.output.find("  " + o->get_name()), std::string::npos) << argv.back() << ": " << o->get_name();
    }
  }
  for (const CLI::App* sub : app.get_subcommands({})) {
    std::vector<std::string> sub_argv = argv;
    sub_argv.push_back(sub->get_name());
    expect_help_lists_options(*sub, sub_argv);
  }
}

TEST(CliHelp, EveryCommandListsItsOptions) {
  for (const std::string& name : vlm::app::command_names()) {
    vlm::app::CommandApp cmd = vlm::app::make_command(name);
    size_t declared = cmd.app->get_options().size();
    for (const CLI::App* sub : cmd.app->get_subcommands({})) declared += sub->get_options().size();
    EXPECT_GE(declared, 2u) << name;  // --help and at least one more
    expect_help_lists_options(*cmd.app, {vlm::test::vlmtrain_bin(), name});
  }
}

TEST(CliHelp, UnknownOptionSuggestsTheClosest) {
  std::string recipe = vlm::test::source_dir() + "/recipes/ocr_tiny.toml";
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "eval", recipe, "--max-new-token", "5"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("vlmtrain eval: unknown option(s) --max-new-token (did you mean --max-new-tokens?)"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("see `vlmtrain eval --help`"), std::string::npos) << r.output;
  // Nothing close: no suggestion.
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "score", "--pred", "p.jsonl", "--zzzzzzzz"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("unknown option(s) --zzzzzzzz;"), std::string::npos) << r.output;
  // In a subcommand, and for the launcher's options.
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "image", "a.png", "--max-pixel", "9"});
  EXPECT_NE(r.output.find("vlmtrain inspect image: unknown option(s) --max-pixel (did you mean --max-pixels?)"),
            std::string::npos) << r.output;
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "launch", "--nproc-per-nod", "2", recipe});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("unknown option --nproc-per-nod (did you mean --nproc-per-node?)"), std::string::npos)
      << r.output;
}

TEST(CliHelp, TypedValuesAreChecked) {
  std::string recipe = vlm::test::source_dir() + "/recipes/ocr_tiny.toml";
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--world-size", "abc"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("vlmtrain plan: --world-size expects an integer, got 'abc'"), std::string::npos)
      << r.output;
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "export", "--checkpoint", "c", "--out", "o", "--max-shard-gb=big"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--max-shard-gb expects a number, got 'big'"), std::string::npos) << r.output;
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "train", recipe, "--dry-run=yes"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--dry-run takes no value"), std::string::npos) << r.output;
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "synth-ocr", "--out", "o", "--train"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--train needs a value"), std::string::npos) << r.output;
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "report", "run_a", "run_b"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("vlmtrain report: unexpected argument 'run_b'"), std::string::npos) << r.output;
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "image"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("vlmtrain inspect image: missing FILE"), std::string::npos) << r.output;
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("missing the subcommand (one of: data, image)"), std::string::npos) << r.output;
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "imag", "a.png"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("unexpected argument 'imag' (expected one of: data, image)"), std::string::npos)
      << r.output;
}

TEST(CliParse, ValuesFlagsAndPositionals) {
  auto app = vlm::app::make_app("vlmtrain x");
  std::optional<long long> n;
  std::optional<double> lr;
  std::vector<std::string> data, texts;
  std::optional<std::string> out;
  bool ids = false;
  vlm::app::add_value(*app, "TEXT", texts, "", "texts");
  vlm::app::add_value(*app, "--n", n, "N", "an integer");
  vlm::app::add_value(*app, "--lr", lr, "X", "a number");
  vlm::app::add_value(*app, "--data", data, "FILE", "repeatable");
  vlm::app::add_value(*app, "--out", out, "DIR", "a folder");
  vlm::app::add_flag(*app, "--ids", ids, "a flag");
  // A flag never takes the next token; a repeated value keeps the last; --name=value;
  // decimal integers (not octal); negative numbers are values; `--` ends the options.
  ASSERT_TRUE(vlm::app::parse_command(*app, {"--ids", "A", "--n", "010", "B", "--n=-7", "--lr", "2e-5", "--data",
                                             "a", "--data=b", "C", "--", "--not-an-option"}));
  EXPECT_TRUE(ids);
  EXPECT_EQ(n.value(), -7);
  EXPECT_DOUBLE_EQ(lr.value(), 2e-5);
  EXPECT_FALSE(out.has_value());
  EXPECT_EQ(data, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(texts, (std::vector<std::string>{"A", "B", "C", "--not-an-option"}));

  auto again = vlm::app::make_app("vlmtrain x");
  vlm::app::add_value(*again, "--n", n, "N", "an integer");
  ASSERT_TRUE(vlm::app::parse_command(*again, {"--n", "010"}));
  EXPECT_EQ(n.value(), 10);
  EXPECT_THROW(vlm::app::parse_command(*again, {"--n", "1.5"}), vlm::Error);
}

TEST(CliParse, DidYouMean) {
  const std::vector<std::string> known = {"--max-new-tokens", "--max-samples", "--batch-size", "--model"};
  EXPECT_EQ(vlm::app::did_you_mean("--max-new-token", known), "--max-new-tokens");
  EXPECT_EQ(vlm::app::did_you_mean("--batchsize", known), "--batch-size");
  EXPECT_EQ(vlm::app::did_you_mean("--modle", known), "--model");
  EXPECT_EQ(vlm::app::did_you_mean("--output-dir", known), "");
  EXPECT_EQ(vlm::app::did_you_mean("trian", {"train", "eval"}), "train");
}

}  // namespace
