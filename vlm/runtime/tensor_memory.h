// Tensor memory meter: the bytes of CPU tensor storage alive now and at the peak, counted
// by a CPU allocator that wraps LibTorch's own (c10::SetCPUAllocator with a higher
// priority). It sees every storage the CPU allocator hands out (parameters, gradients,
// optimizer state, FSDP's gathered buffers, activations, temporaries); not pinned memory,
// not Gloo's or the shared-memory channel's own buffers, not the malloc slack around them.
// On CUDA the caching allocator's own statistics play this role (peak allocated bytes).
//
//   vlm::TensorMemoryMeter::install();          // once, before the tensors to be counted
//   vlm::TensorMemoryMeter::reset_peak();
//   ... one training step ...
//   int64_t peak = vlm::TensorMemoryMeter::peak_bytes();
//
// Storages allocated before install() are not counted (and not subtracted when freed).
#pragma once
#include <cstdint>

namespace vlm {

class TensorMemoryMeter {
 public:
  // Installs the counting allocator (idempotent; thread-safe counters).
  static void install();
  static bool installed();
  static int64_t live_bytes();  // CPU tensor bytes allocated through the meter and not freed
  static int64_t peak_bytes();  // the most live_bytes() since install() / reset_peak()
  static void reset_peak();     // peak = live now
};

}  // namespace vlm
