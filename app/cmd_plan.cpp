// `vlmtrain plan`: print the module/unit table and memory per rank (no weights needed).
#include "app/commands.h"

namespace vlmtrain {

const char* help_plan() {
  return R"(usage: vlmtrain plan RECIPE [--preset NAME] [--world-size N] [--json] [--set KEY=VALUE]...
       vlmtrain plan --preset NAME [--world-size N] [--json]

Builds the model on the meta device and prints every module with its parameter count,
policy and bytes per rank, plus totals.
)";
}

int cmd_plan(Args& args) {
  (void)args;
  not_yet("plan", "issue #3");
}

}  // namespace vlmtrain
