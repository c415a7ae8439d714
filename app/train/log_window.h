// The step log: one line per log.every steps (and at the last step), every field also in
// metrics.jsonl. Rates (tokens, images, samples per second, MFU, step time, data wait,
// padding) are over the window of steps since the previous line; loss, grad norm, lr and
// the step's counts are those of the window's last step.
//
//   LogWindow window({recipe.log.every, steps_total, world, peak_flops_per_rank});
//   each step:  window.add(global_stats, step_seconds, wait_seconds, planned_bytes);
//               if (window.due(st.step)) window.write(last, mem, tensor_peak, bar, metrics, main);
//
// The line (rank 0) and the metrics.jsonl keys are an interface: tests/ and scripts/ parse
// them. The line:
//   step   12/100 | ep 0.24 | loss 2.3456 | gnorm 1.234 | lr 1.00e-04 | tok/s 1234 | img/s 5.6
//   | smp/s 7.8 | pad 3.1% | mfu 12.34% | mem 1.2G (plan 1.3G) | data 4%[ | bubble 20%] | eta 3m07s[ | SKIPPED]
// (bubble: pipeline parallelism only).
// The metrics.jsonl object's keys (written sorted, as nlohmann::json orders them): step,
// epoch, loss, grad_norm, lr, skipped, supervised_tokens, tokens_per_s, images_per_s,
// samples_per_s, mfu, step_s, data_wait_pct, micro_batches, pipeline_bubble, peak_rss_bytes,
// tensor_peak_bytes, tensor_peak_planned_bytes, mem_params_bytes, mem_grads_bytes,
// mem_optim_bytes, mem_host_optim_bytes, mem_gathered_peak_bytes, dropped_samples,
// padding_fraction, world_size, elapsed_s.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "app/report/metrics_file.h"
#include "app/report/progress.h"
#include "app/train/step_stats.h"
#include "collate/step_plan.h"
#include "sharding/parallel/sharded_model.h"

namespace vlm::app {

struct LogWindowOptions {
  int64_t every = 1;                // log.every: a line when step % every == 0 ...
  int64_t steps_total = 1;          // ... and at the last step
  int world = 1;                    // ranks (MFU is per rank: flops / (seconds * peak * world))
  double peak_flops_per_rank = 0;   // 0: unknown, mfu 0
};

// The window's last step: the values the line shows for that step alone.
struct StepFacts {
  int64_t step = 0;               // steps done (1-based number of the step just done)
  double epoch = 0;               // cursor epoch + offset / dataset size
  double loss = 0;                // token-weighted global mean loss
  double grad_norm = 0;
  double lr = 0;
  bool skipped = false;           // non-finite: no update
  int64_t supervised_tokens = 0;  // global
  size_t micro_batches = 0;       // this rank's (the same on every rank)
  double pipeline_bubble = 0;     // pipeline parallelism: (p - 1) / (m + p - 1) of the step; 0 without
  int64_t dropped_samples = 0;    // global, this step
  double elapsed_s = 0;           // TrainerState::train_seconds
};

class LogWindow {
 public:
  explicit LogWindow(const LogWindowOptions& o);

  // A finished step: its global statistics (reduce_step_stats), wall seconds, seconds this
  // rank waited for the loader, and its planned peak tensor bytes (step_memory.h).
  void add(const StepStats& global, double seconds, double wait_seconds, double planned_bytes);
  // Whether the step just done ends a window (step % every == 0 or the last step).
  bool due(int64_t step) const { return step % o_.every == 0 || step == o_.steps_total; }

  // The window's metrics.jsonl object (keys in the file comment). `mem`: this rank's
  // memory report; `tensor_peak`: the device's peak tensor bytes over the window.
  nlohmann::json metrics(const StepFacts& f, const vlm::sharding::MemoryReport& mem, int64_t tensor_peak) const;
  // The window's step log line (format in the file comment); `eta`: human_seconds of the rest.
  std::string line(const StepFacts& f, int64_t tensor_peak, const std::string& eta) const;
  // Ends the window: builds the object, clears the bar, logs the line (`main`), appends the
  // object to `metrics` (a no-op off rank 0), then starts a new window.
  void write(const StepFacts& f, const vlm::sharding::MemoryReport& mem, int64_t tensor_peak, ProgressBar& bar,
             MetricsFile& metrics, bool main);
  // Starts a new window (all sums 0).
  void reset();

 private:
  LogWindowOptions o_;
  double seconds_ = 0, wait_ = 0, flops_ = 0, planned_ = 0;  // planned_: the max over the window
  int64_t steps_ = 0, tokens_ = 0, images_ = 0, samples_ = 0;
  vlm::collate::PaddingCount padding_;  // all ranks: micro-batch tokens, padding among them
};

}  // namespace vlm::app
