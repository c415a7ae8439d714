// The step log's window (contract in log_window.h).
#include "app/train/log_window.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "app/train/startup_log.h"
#include "vlm/runtime/process_memory.h"

namespace vlm::app {

LogWindow::LogWindow(const LogWindowOptions& o) : o_(o) {}

void LogWindow::add(const StepStats& global, double seconds, double wait_seconds, double planned_bytes) {
  planned_ = std::max(planned_, planned_bytes);
  seconds_ += seconds;
  wait_ += wait_seconds;
  flops_ += global.flops;
  steps_ += 1;
  tokens_ += global.llm_tokens;
  images_ += global.images;
  samples_ += global.samples;
  padding_ += {global.padding_tokens, global.padding};
}

nlohmann::json LogWindow::metrics(const StepFacts& f, const vlm::sharding::MemoryReport& mem,
                                  int64_t tensor_peak) const {
  const double mfu = o_.peak_flops_per_rank > 0 ? flops_ / (seconds_ * o_.peak_flops_per_rank * o_.world) : 0;
  return {{"step", f.step},
          {"epoch", f.epoch},
          {"loss", f.loss},
          {"grad_norm", f.grad_norm},
          {"lr", f.lr},
          {"skipped", f.skipped},
          {"supervised_tokens", f.supervised_tokens},
          {"tokens_per_s", tokens_ / seconds_},
          {"images_per_s", images_ / seconds_},
          {"samples_per_s", samples_ / seconds_},
          {"mfu", mfu},
          {"step_s", seconds_ / steps_},
          {"data_wait_pct", 100.0 * wait_ / seconds_},
          {"micro_batches", f.micro_batches},
          {"pipeline_bubble", f.pipeline_bubble},
          {"peak_rss_bytes", peak_rss_bytes()},
          {"tensor_peak_bytes", tensor_peak},
          {"tensor_peak_planned_bytes", planned_},
          {"mem_params_bytes", mem.param_bytes},
          {"mem_grads_bytes", mem.grad_bytes},
          {"mem_optim_bytes", mem.optim_bytes},
          {"mem_host_optim_bytes", mem.host_optim_bytes},
          {"mem_gathered_peak_bytes", mem.gathered_peak_bytes},
          {"dropped_samples", f.dropped_samples},
          {"padding_fraction", padding_.fraction()},
          {"world_size", o_.world},
          {"elapsed_s", f.elapsed_s}};
}

std::string LogWindow::line(const StepFacts& f, int64_t tensor_peak, const std::string& eta) const {
  const double mfu = o_.peak_flops_per_rank > 0 ? flops_ / (seconds_ * o_.peak_flops_per_rank * o_.world) : 0;
  return fmt::format("step {:>5}/{} | ep {:.2f} | loss {:.4f} | gnorm {:.3f} | lr {:.2e} | tok/s {:.0f} | img/s {:.1f} "
                     "| smp/s {:.1f} | pad {:.1f}% | mfu {:.2f}% | mem {} (plan {}) | data {:.0f}%{} | eta {}{}",
                     f.step, o_.steps_total, f.epoch, f.loss, f.grad_norm, f.lr, tokens_ / seconds_,
                     images_ / seconds_, samples_ / seconds_, 100 * padding_.fraction(), 100 * mfu,
                     short_bytes(static_cast<double>(tensor_peak > 0 ? tensor_peak : peak_rss_bytes())),
                     short_bytes(planned_), 100.0 * wait_ / seconds_,
                     f.pipeline_bubble > 0 ? fmt::format(" | bubble {:.0f}%", 100 * f.pipeline_bubble) : "", eta,
                     f.skipped ? " | SKIPPED" : "");
}

void LogWindow::write(const StepFacts& f, const vlm::sharding::MemoryReport& mem, int64_t tensor_peak,
                      ProgressBar& bar, MetricsFile& metrics_file, bool main) {
  const nlohmann::json j = metrics(f, mem, tensor_peak);
  bar.clear();
  if (main) spdlog::info("{}", line(f, tensor_peak, human_seconds(bar.eta_seconds(f.step))));
  metrics_file.write(j);
  reset();
}

void LogWindow::reset() {
  seconds_ = wait_ = flops_ = planned_ = 0;
  steps_ = tokens_ = images_ = samples_ = 0;
  padding_ = {};
}

}  // namespace vlm::app
