// Host -> device copies inside the training step without a host synchronisation.
//
// A copy from pageable host memory to a GPU makes the host wait for it (the driver stages
// through its own pinned buffer), which breaks the step's "one host sync per step"
// (docs/design.md). Small host-built tensors of the forward (rotary positions, window
// indices, interpolation taps, segment boundaries, loss rows) go through stage_to_device:
// copied into pinned memory from PyTorch's caching host allocator, which records the copy's
// stream so the block is not reused before the copy has run, then copied asynchronously.
//
//   auto index = stage_to_device(host_index, x.device());  // [M] int64 on x's device
//
// The forward's code in vlm/model and vlm/families moves tensors to a device only through
// this call (scripts/check_layout.sh checks it).
#pragma once
#include <torch/torch.h>

namespace vlm {

// `t` on `device`: itself when already there (or undefined); a pinned, non-blocking copy
// from the host to a CUDA device; a plain copy otherwise (device -> host syncs: not for the
// step).
torch::Tensor stage_to_device(const torch::Tensor& t, torch::Device device);

// The same with a dtype conversion, done after the copy (on the device).
torch::Tensor stage_to_device(const torch::Tensor& t, torch::Device device, torch::Dtype dtype);

}  // namespace vlm
