// `vlmtrain report`: render curves and a summary page from a run directory.
#include "app/commands.h"

namespace vlmtrain {

const char* help_report() {
  return R"(usage: vlmtrain report RUN_DIR
)";
}

int cmd_report(Args& args) {
  (void)args;
  not_yet("report", "issue #9");
}

}  // namespace vlmtrain
