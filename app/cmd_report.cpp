// `vlmtrain report`: render curves and a summary page from a run directory.
#include <cstdio>

#include "app/commands.h"
#include "app/report.h"

namespace vlmtrain {

const char* help_report() {
  return R"(usage: vlmtrain report RUN_DIR

Reads RUN_DIR/metrics.jsonl (written by `vlmtrain train`) and writes
  RUN_DIR/report.png    loss, lr, grad norm, throughput, MFU, data wait and eval curves
  RUN_DIR/report.html   the PNG with the run summary, eval summary and resolved recipe
)";
}

int cmd_report(Args& args) {
  const std::string dir = args.positional(0, "RUN_DIR");
  args.finish();
  ReportResult r = write_report(dir);
  std::printf("report: %lld steps -> %s, %s\n", static_cast<long long>(r.steps), r.png.c_str(), r.html.c_str());
  return 0;
}

}  // namespace vlmtrain
