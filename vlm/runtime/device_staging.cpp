// Host -> device copies without a host sync (see device_staging.h).
#include "vlm/runtime/device_staging.h"

namespace vlm {

torch::Tensor stage_to_device(const torch::Tensor& t, torch::Device device) {
  if (!t.defined() || t.device() == device) return t;
  if (t.is_cpu() && device.is_cuda()) {
    const torch::Tensor pinned = t.is_pinned() ? t : t.contiguous().pin_memory();
    return pinned.to(device, /*non_blocking=*/true);
  }
  return t.to(device);
}

torch::Tensor stage_to_device(const torch::Tensor& t, torch::Device device, torch::Dtype dtype) {
  if (!t.defined()) return t;
  return stage_to_device(t, device).to(dtype);
}

}  // namespace vlm
