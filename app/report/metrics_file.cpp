// metrics.jsonl + TensorBoard (contract in metrics_file.h).
#include "app/report/metrics_file.h"

#include <filesystem>

#include "vlm/runtime/check.h"

namespace fs = std::filesystem;

namespace vlm::app {

MetricsFile::MetricsFile(const std::string& dir, bool enabled, bool tensorboard, int64_t first_step)
    : tb_(enabled && tensorboard ? (fs::path(dir) / "tb").string() : "", first_step) {
  if (!enabled) return;
  path_ = (fs::path(dir) / "metrics.jsonl").string();
  out_.open(path_, std::ios::app);
  VLM_CHECK(out_.good(), "cannot open ", path_, " for appending (hint: check run.output_dir)");
}

void MetricsFile::write(const nlohmann::json& j) {
  if (!out_.is_open()) return;
  out_ << j.dump() << "\n";
  out_.flush();
  tb_.write_metrics(j);
}

}  // namespace vlm::app
