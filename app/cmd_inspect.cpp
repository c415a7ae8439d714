// `vlmtrain inspect`: inspect a dataset or an image as the pipeline sees it.
#include "app/commands.h"

namespace vlmtrain {

const char* help_inspect() {
  return R"(usage: vlmtrain inspect data RECIPE [--set KEY=VALUE]...
       vlmtrain inspect image FILE [--min-pixels N] [--max-pixels N | --max-image-tokens N] [--json]
)";
}

int cmd_inspect(Args& args) {
  (void)args;
  not_yet("inspect", "issue #5");
}

}  // namespace vlmtrain
