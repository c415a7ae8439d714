// `vlmtrain report`: a run directory's metrics.jsonl -> curves (PNG, drawn with OpenCV) and
// a one-page HTML summary.
//
//   ReportResult r = write_report("runs/ocr_tiny");  // runs/ocr_tiny/report.{png,html}
#pragma once
#include <map>
#include <string>
#include <vector>

namespace vlm::app {

// One plotted series: (step, value) points.
struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

// Series by metrics.jsonl field (loss, lr, grad_norm, tokens_per_s, eval fields, ...), in
// file order; a resumed run's repeated steps keep the latest value. Throws naming the
// file and line for malformed lines.
std::map<std::string, Series> read_metrics(const std::string& metrics_jsonl);

// Renders the panels (one per present series among `fields`) into a PNG.
void plot_series(const std::vector<Series>& panels, const std::string& png_path, int width = 1200);

struct ReportResult {
  std::string png, html;
  int64_t steps = 0;  // last step in metrics.jsonl
};

ReportResult write_report(const std::string& run_dir);

}  // namespace vlm::app
