// Learning-rate schedule: the factor the optimizer multiplies each group's lr by.
//
// For the update of optimizer step s (0-based, s < total):
//   warmup  (s < warmup):  (s + 1) / warmup                 linear, reaches 1 at s = warmup-1
//   decay   p = (s - warmup) / max(1, total - warmup)       in [0, 1)
//     cosine:   r + (1 - r) * (1 + cos(pi p)) / 2
//     linear:   r + (1 - r) * (1 - p)
//     constant: 1
// with r = min_lr_ratio. Pure: resuming at step s gives the same factors.
#pragma once
#include <cstdint>
#include <string>

namespace vlm::app {

struct LrSchedule {
  int64_t total_steps = 1;
  int64_t warmup_steps = 0;
  std::string decay = "cosine";  // cosine | linear | constant
  double min_lr_ratio = 0.0;

  double factor(int64_t step) const;
};

}  // namespace vlm::app
