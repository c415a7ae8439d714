// `vlmtrain train RECIPE` (also `vlmtrain RECIPE`): the training entry point.
#include <spdlog/spdlog.h>

#include <cstdio>

#include "app/commands.h"
#include "app/logging.h"

namespace vlmtrain {

const char* help_train() {
  return R"(usage: vlmtrain train RECIPE [--set section.key=value]... [--dry-run]
       vlmtrain RECIPE [--set section.key=value]... [--dry-run]

Trains the model the recipe describes: loads the model (preset or HF directory), applies
the sharding policy table, runs the step loop with checkpoints and periodic eval.
Run under torchrun / srun / `vlmtrain launch` for several processes.

options:
  --set KEY=VALUE   override a recipe key (TOML value syntax, e.g. --set optim.lr=2e-5,
                    --set data.train='["a.jsonl","b.jsonl"]'); may be repeated
  --dry-run         parse and validate the recipe, print it resolved, and exit

Recipe keys are documented in app/recipe.h; recipes/ holds examples.
)";
}

int cmd_train(Args& args) {
  Recipe recipe = recipe_from_args(args);
  bool dry_run = args.flag("dry-run");
  args.finish();
  recipe.validate(Purpose::train);
  if (dry_run) {
    std::printf("# resolved recipe (%s, hash %s)\n%s", recipe.source.c_str(),
                recipe_hash(recipe).c_str(), to_toml(recipe).c_str());
    return 0;
  }
  init_logging(0, 1, recipe.log.level, recipe.log.all_ranks);
  spdlog::info("recipe {} (hash {}), resolved:\n{}", recipe.source, recipe_hash(recipe), to_toml(recipe));
  std::string saved = save_resolved_recipe(recipe, recipe.run.output_dir);
  spdlog::info("resolved recipe saved to {}", saved);
  not_yet("train", "issue #9");
}

}  // namespace vlmtrain
