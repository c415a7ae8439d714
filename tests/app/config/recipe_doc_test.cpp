// The recipe key reference: docs/recipe.md is exactly what `vlmtrain recipe --doc` prints
// (generated from the field lists of app/config/recipe.h), every key a recipe can hold has a
// documented row, and `vlmtrain recipe RECIPE` prints the resolved recipe.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "app/config/recipe.h"
#include "app/config/recipe_doc.h"
#include "tests/testing.h"

namespace {

const char* const kRecipeDocRegenerate =
    "docs/recipe.md differs from what `vlmtrain recipe --doc` prints (app/config/recipe.h's field lists changed, or "
    "the file was edited by hand). Regenerate it from the repository root with\n"
    "  ./build/vlmtrain recipe --doc > docs/recipe.md\nand commit the result.";

std::vector<std::string> recipe_doc_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// "line N: expected ... / committed ..." for the first line where the two texts differ.
std::string recipe_doc_first_difference(const std::string& generated, const std::string& committed) {
  const auto g = recipe_doc_lines(generated), c = recipe_doc_lines(committed);
  for (size_t i = 0; i < std::max(g.size(), c.size()); ++i) {
    const std::string gl = i < g.size() ? g[i] : "(end of file)";
    const std::string cl = i < c.size() ? c[i] : "(end of file)";
    if (gl != cl)
      return "first difference at line " + std::to_string(i + 1) + ":\n  generated: " + gl + "\n  committed: " + cl;
  }
  return "the files differ only in their final newline";
}

// Section heading ("[data.synth]", "[[optim.group]]") -> the section's table rows.
std::map<std::string, std::vector<std::string>> recipe_doc_rows(const std::string& reference) {
  std::map<std::string, std::vector<std::string>> rows;
  std::string section;
  for (const std::string& line : recipe_doc_lines(reference)) {
    if (line.rfind("## `", 0) == 0) section = line.substr(4, line.size() - 5);
    else if (line.rfind("| `", 0) == 0) rows[section].push_back(line);
  }
  return rows;
}

TEST(RecipeDoc, CommittedReferenceIsWhatTheBinaryPrints) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "recipe", "--doc"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, vlm::app::recipe_reference()) << "the binary and the library disagree";
  const std::string path = vlm::test::source_dir() + "/docs/recipe.md";
  ASSERT_TRUE(vlm::test::file_exists(path)) << path << " is missing.\n" << kRecipeDocRegenerate;
  const std::string committed = vlm::test::read_file(path);
  EXPECT_TRUE(r.output == committed) << kRecipeDocRegenerate << "\n" << recipe_doc_first_difference(r.output, committed);
}

TEST(RecipeDoc, EveryKeyOfAFullRecipeHasADocumentedRow) {
  // A recipe that uses every kind of table, optionals set: the LoRA recipe plus an optimizer
  // group and the generation keys.
  const std::vector<std::string> sets = {
      "optim.group=[{match = \"visual.*\", lr = 1e-5, weight_decay = 0.0}]", "eval.do_sample=true",
      "eval.temperature=0.7", "eval.top_k=20", "eval.top_p=0.9", "eval.repetition_penalty=1.05"};
  const vlm::app::Recipe recipe =
      vlm::app::load_recipe(vlm::test::source_dir() + "/recipes/ocr_qwen_lora.toml", sets);
  const auto rows = recipe_doc_rows(vlm::app::recipe_reference());
  std::string section;
  int checked = 0;
  for (const std::string& line : recipe_doc_lines(vlm::app::to_toml(recipe))) {
    if (line.empty()) continue;
    if (line[0] == '[') {
      section = line;
      continue;
    }
    const std::string key = line.substr(0, line.find(" = "));
    ASSERT_TRUE(rows.count(section)) << "no section " << section << " in the reference";
    bool found = false;
    for (const std::string& row : rows.at(section)) {
      if (row.rfind("| `" + key + "` |", 0) != 0) continue;
      found = true;
      // The last cell (the doc) is not empty.
      const size_t last = row.rfind(" |");
      const size_t before = row.rfind("| ", last - 1);
      EXPECT_GT(last, before + 2) << section << " " << key << ": empty doc in\n" << row;
    }
    EXPECT_TRUE(found) << section << " " << key << " has no row in the reference";
    ++checked;
  }
  EXPECT_GT(checked, 80);
}

TEST(RecipeDoc, RecipeCommandPrintsTheResolvedRecipe) {
  const std::string recipe = vlm::test::source_dir() + "/recipes/ocr_tiny.toml";
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "recipe", recipe, "--set", "optim.lr=5e-4"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const vlm::app::Recipe printed = vlm::app::parse_recipe(r.output, "printed.toml");
  EXPECT_EQ(vlm::app::recipe_hash(printed), vlm::app::recipe_hash(vlm::app::load_recipe(recipe, {"optim.lr=5e-4"})));
  EXPECT_EQ(printed.optim.lr, 5e-4);

  r = vlm::test::run({vlm::test::vlmtrain_bin(), "recipe"});  // the defaults
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, vlm::app::to_toml(vlm::app::Recipe{}));

  r = vlm::test::run({vlm::test::vlmtrain_bin(), "recipe", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("usage: vlmtrain recipe"), std::string::npos) << r.output;

  r = vlm::test::run({vlm::test::vlmtrain_bin(), "recipe", "--doc", recipe});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--doc takes no RECIPE"), std::string::npos) << r.output;
}

}  // namespace
