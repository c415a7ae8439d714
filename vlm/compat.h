// The one place where LibTorch 1.13 (Debian, CPU) and 2.x (CUDA builds) differ.
#pragma once
#include <torch/torch.h>

#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
#define VLM_TORCH2 1
#else
#define VLM_TORCH2 0
#endif

namespace vlm::compat {

// "1.13.1" etc.
inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// True when at::scaled_dot_product_attention (flash / memory-efficient / cuDNN kernels)
// exists; LibTorch 1.13 has only the plain matmul-softmax path.
constexpr bool has_sdpa() { return VLM_TORCH2 != 0; }

// Whether the c10d Gloo backend in this LibTorch supports the flat-buffer collectives
// (_allgather_base / _reduce_scatter_base / reduce_scatter). 1.13's Gloo refuses them.
constexpr bool gloo_has_flat_collectives() { return VLM_TORCH2 != 0; }

// Whether Gloo all-reduce accepts bf16 (1.13: "Invalid scalar type").
constexpr bool gloo_has_bf16_allreduce() { return VLM_TORCH2 != 0; }

}  // namespace vlm::compat

// c10d: in 1.13 ProcessGroupGloo / ProcessGroupNCCL derive from c10d::ProcessGroup; in 2.x
// they derive from c10d::Backend (ProcessGroup became a dispatching wrapper). Both bases
// declare the same collective methods (allreduce, allgather, _allgather_base,
// reduce_scatter, _reduce_scatter_base, broadcast, barrier), so sharding/ holds the
// concrete backend through this alias.
// Include the base with `#include VLM_C10D_BACKEND_HEADER` (only sharding/ does).
namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d
namespace vlm::compat {
#if VLM_TORCH2
#define VLM_C10D_BACKEND_HEADER <torch/csrc/distributed/c10d/Backend.hpp>
using CommBackend = c10d::Backend;
#else
#define VLM_C10D_BACKEND_HEADER <torch/csrc/distributed/c10d/ProcessGroup.hpp>
using CommBackend = c10d::ProcessGroup;
#endif
}  // namespace vlm::compat
