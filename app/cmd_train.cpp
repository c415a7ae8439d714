// `vlmtrain train RECIPE` (also `vlmtrain RECIPE`): the training entry point.
#include <cstdio>

#include "app/commands.h"
#include "app/trainer.h"

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
  run_training(recipe);
  return 0;
}

}  // namespace vlmtrain
