// `vlmtrain train`: train a model from a recipe (also: vlmtrain recipe).
#include "app/commands.h"

namespace vlmtrain {

const char* help_train() {
  return R"(usage: vlmtrain train RECIPE [--set section.key=value]...
       vlmtrain RECIPE [--set section.key=value]...

Trains the model the recipe describes: loads the model (preset or HF directory), applies
the sharding policy table, runs the step loop with checkpoints and periodic eval.
Run under torchrun / srun / `vlmtrain launch` for several processes.

options:
  --set KEY=VALUE   override a recipe key (TOML value syntax, e.g. --set optim.lr=2e-5);
                    may be repeated
  --dry-run         parse, validate and print the resolved recipe, then exit
)";
}

int cmd_train(Args& args) {
  (void)args;
  not_yet("train", "issue #9");
}

}  // namespace vlmtrain
