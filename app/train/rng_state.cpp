// RNG states in checkpoints (contract in rng_state.h).
#include "app/train/rng_state.h"

#include <ATen/Context.h>

#include <mutex>

#include "app/train/checkpoint.h"
#include "vlm/runtime/check.h"

namespace vlm::app {
namespace {

// The default generator of `device` (CPU, or the CUDA device's, which the CUDA hooks give as
// at::cuda::detail::getDefaultCUDAGenerator(device.index()); index -1 = the current device).
at::Generator rng_default_generator(const torch::Device& device) {
  return device.is_cuda() ? at::globalContext().defaultGenerator(device)
                          : at::globalContext().defaultGenerator(torch::Device(torch::kCPU));
}

torch::Tensor rng_get_state(const torch::Device& device) {
  at::Generator gen = rng_default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());  // as torch's own get_rng_state does
  return gen.get_state();
}

void rng_set_state(const torch::Device& device, const torch::Tensor& state) {
  at::Generator gen = rng_default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

vlm::NamedTensors capture_rng_states(const torch::Device& device) {
  vlm::NamedTensors out;
  out.emplace_back(kRngCpuKey, rng_get_state(torch::Device(torch::kCPU)));
  if (device.is_cuda()) out.emplace_back(kRngCudaKey, rng_get_state(device));
  return out;
}

RngRestore restore_rng_states(const CheckpointReader& ck, int64_t rank, int64_t world_size,
                              const torch::Device& device) {
  RngRestore r;
  if (ck.world_size() != world_size) {
    r.differs.push_back(vlm::str("RNG states not restored: the checkpoint was written by ", ck.world_size(),
                                 " rank(s), this run has ", world_size,
                                 " (a stream belongs to its rank); random draws (dropout) differ from an "
                                 "uninterrupted run"));
    return r;
  }
  const torch::Tensor cpu = ck.rng_state(rank, kRngCpuKey);
  if (cpu.defined()) {
    rng_set_state(torch::Device(torch::kCPU), cpu);
    r.restored.push_back(kRngCpuKey);
  } else {
    r.differs.push_back(vlm::str("rank ", rank, "'s state file holds no ", kRngCpuKey,
                                 ": the CPU random stream differs from an uninterrupted run"));
  }
  const torch::Tensor cuda = ck.rng_state(rank, kRngCudaKey);
  if (device.is_cuda() && cuda.defined()) {
    rng_set_state(device, cuda);
    r.restored.push_back(kRngCudaKey);
  } else if (device.is_cuda()) {
    r.differs.push_back(vlm::str("the checkpoint holds no ", kRngCudaKey,
                                 " (it was written on CPU) and this run is on CUDA: the CUDA random stream "
                                 "(dropout masks) differs from an uninterrupted run"));
  } else if (cuda.defined()) {
    r.differs.push_back(vlm::str("the checkpoint holds a ", kRngCudaKey,
                                 " state (it was written on CUDA) and this run is on CPU: it is not used, and "
                                 "random draws (dropout masks) differ from an uninterrupted run"));
  }
  return r;
}

}  // namespace vlm::app
