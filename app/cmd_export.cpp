// `vlmtrain export`: write a consolidated hf directory from a checkpoint.
#include "app/commands.h"

namespace vlmtrain {

const char* help_export() {
  return R"(usage: vlmtrain export --checkpoint DIR --out HF_DIR [--dtype bf16|fp32]
)";
}

int cmd_export(Args& args) {
  (void)args;
  not_yet("export", "issue #9");
}

}  // namespace vlmtrain
