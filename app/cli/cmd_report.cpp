// `vlmtrain report`: render curves and a summary page from a run directory.
#include <cstdio>

#include "app/cli/commands.h"
#include "app/report/run_report.h"

namespace vlm::app {

namespace {

int report(const std::string& dir) {
  ReportResult r = write_report(dir);
  std::printf("report: %lld steps -> %s, %s\n", static_cast<long long>(r.steps), r.png.c_str(), r.html.c_str());
  return 0;
}

}  // namespace

CommandRun declare_report(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  app.description(R"(usage: vlmtrain report RUN_DIR

Reads RUN_DIR/metrics.jsonl (written by `vlmtrain train`) and writes
  RUN_DIR/report.png    loss, lr, grad norm, throughput, MFU, data wait and eval curves
  RUN_DIR/report.html   the PNG with the run summary, eval summary and resolved recipe
)");
  add_value(app, "RUN_DIR", *dir, "", "a run directory (run.output_dir of the recipe)")->required();
  return [dir] { return report(*dir); };
}

}  // namespace vlm::app
