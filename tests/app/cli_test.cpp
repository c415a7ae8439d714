// The vlmtrain binary as a user runs it: help for every subcommand, clear errors.
#include <gtest/gtest.h>

#include "app/cli.h"
#include "app/recipe.h"
#include "tests/testing.h"
#include "vlm/check.h"

namespace {

const std::vector<std::string> kCommands = {"train", "eval", "plan", "export", "score", "synth-ocr",
                                            "inspect", "tokenize", "launch", "report"};

TEST(Cli, TopLevelHelpListsEveryCommand) {
  auto r = vlmtest::run({vlmtest::vlmtrain_bin(), "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const auto& c : kCommands) EXPECT_NE(r.output.find("  " + c + " "), std::string::npos) << c;
}

TEST(Cli, HelpForEachSubcommandExitsZero) {
  for (const auto& c : kCommands) {
    auto r = vlmtest::run({vlmtest::vlmtrain_bin(), c, "--help"});
    EXPECT_EQ(r.exit_code, 0) << c << ": " << r.output;
    EXPECT_NE(r.output.find("usage: vlmtrain " + c), std::string::npos) << c << ": " << r.output;
  }
}

TEST(Cli, UnknownSubcommandFailsWithHint) {
  auto r = vlmtest::run({vlmtest::vlmtrain_bin(), "trian"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown command 'trian'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did you mean `train`"), std::string::npos) << r.output;
}

TEST(Cli, NoArgumentsPrintsUsageAndFails) {
  auto r = vlmtest::run({vlmtest::vlmtrain_bin()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("usage:"), std::string::npos) << r.output;
}

TEST(Cli, RecipeAsFirstArgumentMeansTrain) {
  std::string recipe = vlmtest::source_dir() + "/recipes/ocr_tiny.toml";
  auto r = vlmtest::run({vlmtest::vlmtrain_bin(), recipe, "--dry-run", "--set", "optim.lr=5e-4"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("lr = 0.0005"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("preset = \"tiny\""), std::string::npos) << r.output;
}

TEST(Cli, TrainLogsAndSavesTheResolvedRecipe) {
  vlmtest::TempDir dir("cli_run");
  std::string recipe = vlmtest::source_dir() + "/recipes/ocr_tiny.toml";
  // No data (and no rendering): the run stops right after the recipe is logged and saved.
  const std::vector<std::string> sets = {"run.output_dir=" + dir.path() + "/run", "optim.lr=7e-4",
                                         "data.synth.generate_if_missing=false",
                                         "data.train=[\"" + dir.path() + "/absent.jsonl\"]"};
  std::vector<std::string> argv = {vlmtest::vlmtrain_bin(), "train", recipe};
  for (const std::string& s : sets) argv.insert(argv.end(), {"--set", s});
  auto r = vlmtest::run(argv);
  EXPECT_NE(r.output.find("lr = 0.0007"), std::string::npos) << r.output;  // printed at start
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("absent.jsonl"), std::string::npos) << r.output;
  std::string saved = vlmtest::read_file(dir.path() + "/run/recipe.toml");
  vlmtrain::Recipe back = vlmtrain::parse_recipe(saved, "saved.toml");
  vlmtrain::Recipe orig = vlmtrain::load_recipe(recipe, sets);
  EXPECT_EQ(vlmtrain::recipe_hash(back), vlmtrain::recipe_hash(orig));
}

TEST(Cli, BadRecipeExitsNonZeroNamingFileAndKey) {
  vlmtest::TempDir dir("cli");
  std::string path = dir / "broken.toml";
  vlmtest::write_file(path, "[model]\npreset = \"tiny\"\n[optim]\nlearning_rate = 1\n");
  auto r = vlmtest::run({vlmtest::vlmtrain_bin(), "train", path, "--dry-run"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(path + ":4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("optim.learning_rate"), std::string::npos) << r.output;
}

TEST(Cli, UnknownOptionIsRejected) {
  std::string recipe = vlmtest::source_dir() + "/recipes/ocr_tiny.toml";
  auto r = vlmtest::run({vlmtest::vlmtrain_bin(), "train", recipe, "--dry-runn"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown option(s) --dry-runn"), std::string::npos) << r.output;
}

}  // namespace

namespace {

TEST(CliArgs, FlagGivesBackItsNeighbourInPlace) {
  vlmtrain::Args args("x", {"--ids", "A", "B", "--out", "o", "C"});
  EXPECT_TRUE(args.flag("ids"));
  EXPECT_EQ(args.value("out").value(), "o");
  EXPECT_EQ(args.positionals(), (std::vector<std::string>{"A", "B", "C"}));
  EXPECT_NO_THROW(args.finish());
}

TEST(CliArgs, UnreadOptionsAreRejected) {
  vlmtrain::Args args("x", {"--a", "1", "--b"});
  EXPECT_EQ(args.integer("a").value(), 1);
  EXPECT_THROW(args.finish(), vlm::Error);
  vlmtrain::Args flag_with_value("x", {"--json=yes"});
  EXPECT_THROW(flag_with_value.flag("json"), vlm::Error);
  vlmtrain::Args repeated("x", {"--data", "a", "--data", "b"});
  EXPECT_EQ(repeated.values("data"), (std::vector<std::string>{"a", "b"}));
}

}  // namespace
