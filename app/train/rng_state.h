// The random-number generator states a checkpoint keeps for each rank, so a resumed run
// draws the same dropout masks (LoRA dropout) and random numbers as an uninterrupted one.
//
// Keys in the rank's state file (checkpoint.h):
//   "rng/cpu"    the default CPU generator's state (always)
//   "rng/cuda"   the default CUDA generator of the rank's device (when that device is CUDA;
//                at::cuda::detail::getDefaultCUDAGenerator(index), reached through
//                at::globalContext().defaultGenerator(device): its Philox seed and offset)
//
// Restoring (restore_rng_states) applies only on the same world size (rank r's stream
// belongs to rank r); then "rng/cpu" always, and "rng/cuda" when resuming on CUDA and the
// checkpoint holds it. A checkpoint written on CPU resumed on CUDA, or the reverse, restores
// what it can and says that the CUDA stream differs from an uninterrupted run; the run goes
// on (the masks are still random, just not the same ones).
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "vlm/io/safetensors.h"

namespace vlm::app {

class CheckpointReader;

inline constexpr const char* kRngCpuKey = "rng/cpu";
inline constexpr const char* kRngCudaKey = "rng/cuda";

// ("rng/cpu", state) and, when `device` is CUDA, ("rng/cuda", state of that device's default
// generator). Each state is a new uint8 CPU tensor (a copy: later draws do not change it).
vlm::NamedTensors capture_rng_states(const torch::Device& device);

// What restore_rng_states did, for the log: the keys it restored, and one line per stream
// that now differs from an uninterrupted run (and why).
struct RngRestore {
  std::vector<std::string> restored;  // e.g. {"rng/cpu", "rng/cuda"}
  std::vector<std::string> differs;
};

// Sets this process's generators from rank `rank`'s states in `ck` (see the header
// comment). Local: no collective.
RngRestore restore_rng_states(const CheckpointReader& ck, int64_t rank, int64_t world_size,
                              const torch::Device& device);

}  // namespace vlm::app
