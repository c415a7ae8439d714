#include "vlm/runtime/runtime_info.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <cstdint>

#include "vlm/runtime/check.h"

#ifdef USE_C10D_NCCL
namespace torch::cuda::nccl {
std::uint64_t version();  // libtorch_cuda; declared in torch/csrc/cuda/nccl.h (which needs nccl.h)
}
#endif

namespace vlm {

namespace {
// CUDA runtime version code 13000 -> "13.0"; cuDNN 91900 -> "9.19.0".
std::string cuda_string(long v) { return str(v / 1000, ".", (v % 1000) / 10); }
std::string cudnn_string(long v) { return str(v / 10000, ".", (v % 10000) / 100, ".", v % 100); }
}  // namespace

std::string torch_version() {
  return str(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH);
}

RuntimeInfo runtime_info() {
  RuntimeInfo r;
  r.vlmtrain = VLMTRAIN_VERSION;
  r.torch = torch_version();
  r.cuda = r.cudnn = r.nccl = "none";
  const auto& hooks = at::detail::getCUDAHooks();
  if (hooks.isBuilt()) {  // libtorch_cuda is loaded (its hooks registered)
    r.cuda = cuda_string(hooks.versionCUDART());
    if (hooks.hasCuDNN()) r.cudnn = cudnn_string(hooks.versionCuDNN());
  }
#ifdef USE_C10D_NCCL
  const std::uint64_t v = torch::cuda::nccl::version();
  r.nccl = str(v >> 32, ".", (v >> 16) & 0xffff, ".", v & 0xffff);
#endif
  r.gpus = static_cast<int>(torch::cuda::device_count());
  return r;
}

std::string version_line(const RuntimeInfo& i) {
  return str("vlmtrain ", i.vlmtrain, " (torch ", i.torch, ", CUDA ", i.cuda, ", cuDNN ", i.cudnn,
             ", NCCL ", i.nccl, ", ", i.gpus, i.gpus == 1 ? " GPU)" : " GPUs)");
}

}  // namespace vlm
