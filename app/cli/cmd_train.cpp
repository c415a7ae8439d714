// `vlmtrain train RECIPE` (also `vlmtrain RECIPE`): the training entry point.
#include <cstdio>

#include "app/cli/commands.h"
#include "app/train/trainer.h"

namespace vlm::app {

namespace {

struct TrainArgs {
  RecipeArgs recipe;
  bool dry_run = false;  // print the resolved recipe and exit
};

int train(const TrainArgs& a) {
  Recipe recipe = load_recipe(a.recipe);
  recipe.validate(Purpose::train);
  if (a.dry_run) {
    std::printf("# resolved recipe (%s, hash %s)\n%s", recipe.source.c_str(),
                recipe_hash(recipe).c_str(), to_toml(recipe).c_str());
    return 0;
  }
  run_training(recipe);
  return 0;
}

}  // namespace

CommandRun declare_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  app.description(R"(usage: vlmtrain train RECIPE [--set section.key=value]... [--dry-run]
       vlmtrain RECIPE [--set section.key=value]... [--dry-run]

Trains the model the recipe describes: loads the model (preset or HF directory), applies
the sharding policy table, runs the step loop with checkpoints and periodic eval.
Run under torchrun / srun / `vlmtrain launch` for several processes.
)");
  add_recipe(app, a->recipe);
  add_flag(app, "--dry-run", a->dry_run, "parse and validate the recipe, print it resolved, and exit");
  app.footer("Recipe keys are documented in app/config/recipe.h; recipes/ holds examples.");
  return [a] { return train(*a); };
}

}  // namespace vlm::app
