// `vlmtrain launch`: spawn n workers with the torchrun environment (no python needed).
#include "app/commands.h"

namespace vlmtrain {

const char* help_launch() {
  return R"(usage: vlmtrain launch --nproc-per-node N [--nnodes M --node-rank R --master-addr A
                       --master-port P] RECIPE [--set KEY=VALUE]...
)";
}

int cmd_launch(Args& args) {
  (void)args;
  not_yet("launch", "issue #11");
}

}  // namespace vlmtrain
