// `vlmtrain recipe`: the recipe format itself. `--doc` prints the key reference (the markdown
// committed as docs/recipe.md, generated from the field lists in app/config/recipe.h);
// otherwise the resolved recipe: RECIPE with every `--set` applied and every default filled
// in, or the defaults alone without RECIPE.
#include <cstdio>
#include <memory>

#include "app/cli/commands.h"
#include "app/config/recipe.h"
#include "app/config/recipe_doc.h"
#include "vlm/runtime/check.h"

namespace vlm::app {

namespace {

struct RecipeCommandArgs {
  RecipeArgs recipe;  // optional
  bool doc = false;   // --doc
};

int recipe_command(const RecipeCommandArgs& a) {
  if (a.doc) {
    VLM_CHECK(a.recipe.path.empty() && a.recipe.sets.empty(),
              "vlmtrain recipe: --doc takes no RECIPE or --set (it documents every key); see `vlmtrain recipe --help`");
    std::fputs(recipe_reference().c_str(), stdout);
    return 0;
  }
  VLM_CHECK(!a.recipe.path.empty() || a.recipe.sets.empty(),
            "vlmtrain recipe: --set needs a RECIPE; see `vlmtrain recipe --help`");
  const Recipe recipe = a.recipe.path.empty() ? Recipe{} : load_recipe(a.recipe);
  std::fputs(to_toml(recipe).c_str(), stdout);
  return 0;
}

}  // namespace

CommandRun declare_recipe(CLI::App& app) {
  auto a = std::make_shared<RecipeCommandArgs>();
  app.description(R"(usage: vlmtrain recipe --doc
       vlmtrain recipe [RECIPE] [--set KEY=VALUE]...

--doc prints the reference of every recipe key (section, key, type, default, allowed
values, doc) as markdown: docs/recipe.md is this output. Otherwise prints RECIPE as
TOML with the overrides applied and every default filled in (without RECIPE: the
defaults). `vlmtrain train RECIPE --dry-run` also validates it for training.
)");
  add_recipe(app, a->recipe, /*required=*/false);
  add_flag(app, "--doc", a->doc, "print the key reference as markdown (docs/recipe.md)");
  return [a] { return recipe_command(*a); };
}

}  // namespace vlm::app
