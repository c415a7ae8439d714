// Learning-rate schedule (see lr_schedule.h).
#include "app/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "vlm/runtime/check.h"

namespace vlm::app {

double LrSchedule::factor(int64_t step) const {
  VLM_CHECK(step >= 0, "lr schedule: step must be >= 0, got ", step);
  if (step < warmup_steps) return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (decay == "constant") return 1.0;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double p = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  const double r = min_lr_ratio;
  if (decay == "cosine") return r + (1 - r) * 0.5 * (1 + std::cos(M_PI * p));
  if (decay == "linear") return r + (1 - r) * (1 - p);
  throw vlm::Error("lr schedule: decay must be cosine | linear | constant, got '" + decay + "'");
}

}  // namespace vlm::app
