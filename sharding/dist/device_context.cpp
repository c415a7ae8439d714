// DeviceContext (see device_context.h).
#include "sharding/dist/device_context.h"

#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <shared_mutex>

#include "vlm/runtime/check.h"
#include "vlm/runtime/tensor_memory.h"

namespace vlm::sharding {

struct DeviceContext::Cuda {
  c10::cuda::CUDAStream copy;
  explicit Cuda(c10::DeviceIndex index) : copy(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)) {}
};

DeviceContext::DeviceContext(torch::Device device) : device_(device) {
  VLM_CHECK(device_.is_cpu() || device_.is_cuda(), "device context: expected a CPU or CUDA device, got ",
            device_.str());
  if (!device_.is_cuda()) return;
  VLM_CHECK(device_.has_index(), "device context: the CUDA device needs an index (cuda:LOCAL_RANK), got ",
            device_.str());
  bind_thread();
  cuda_ = std::make_unique<Cuda>(device_.index());
}

DeviceContext::~DeviceContext() = default;

void DeviceContext::bind_thread() const {
  if (device_.is_cuda()) c10::cuda::set_device(device_.index());
}

DeviceMemory DeviceContext::memory() const {
  if (!device_.is_cuda()) return {TensorMemoryMeter::live_bytes(), TensorMemoryMeter::peak_bytes(), 0};
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
  const auto& all = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  const auto& reserved = stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  DeviceMemory m{all.current, all.peak, reserved.current};
  // PyTorch keys each workspace by (handle, stream); handles are per thread, so the forward's
  // thread and autograd's device thread hold one each (CublasHandlePool.cpp).
  // cuBLASLt's map stays empty where it shares cuBLAS' workspace (TORCH_CUBLASLT_UNIFIED_WORKSPACE).
  auto count = [](at::cuda::WorkspaceMapWithMutex& ws) {
    std::shared_lock<std::shared_mutex> lock(ws.mutex);
    return static_cast<int64_t>(ws.map.size());
  };
  const int64_t blas = count(at::cuda::cublas_handle_stream_to_workspace());
  const int64_t lt = count(at::cuda::cublaslt_handle_stream_to_workspace());
  m.blas_workspaces = blas + lt;
  m.blas_workspace_bytes = blas * static_cast<int64_t>(at::cuda::getChosenWorkspaceSize()) +
                           lt * static_cast<int64_t>(at::cuda::getCUDABlasLtWorkspaceSize());
  return m;
}

void DeviceContext::reset_peak() const {
  if (device_.is_cuda())
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
  else
    TensorMemoryMeter::reset_peak();
}

void DeviceContext::synchronize() const {
  if (device_.is_cuda()) c10::cuda::device_synchronize();
}

torch::Tensor DeviceContext::to_device(const torch::Tensor& host) {
  if (!host.defined() || !cuda_ || host.device() == device_) return host;
  VLM_CHECK(host.is_cpu(), "device context: to_device expects a host tensor, got one on ", host.device().str());
  const auto src = host.is_pinned() ? host.contiguous() : host.contiguous().pin_memory();
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
  torch::Tensor out;
  at::cuda::CUDAEvent ready;
  {
    c10::cuda::CUDAStreamGuard on_copy(cuda_->copy);
    out = torch::empty(src.sizes(), src.options().device(device_).pinned_memory(false));
    out.copy_(src, /*non_blocking=*/true);
    ready.record(cuda_->copy);
  }
  ready.block(compute);
  c10::cuda::CUDACachingAllocator::recordStream(out.storage().data_ptr(), compute);
  copied_bytes_ += static_cast<int64_t>(src.nbytes());
  ++copies_;
  return out;
}

vlm::Batch DeviceContext::to_device(const vlm::Batch& host) {
  vlm::Batch b = host;
  b.input_ids = to_device(host.input_ids);
  b.attention_mask = to_device(host.attention_mask);
  b.labels = to_device(host.labels);
  b.position_ids = to_device(host.position_ids);
  b.pixel_values = to_device(host.pixel_values);
  b.loss_rows = to_device(host.loss_rows);
  b.image_rows = to_device(host.image_rows);
  return b;  // image_grid_thw and text_cu_seqlens stay on the host: attention is planned from them
}

}  // namespace vlm::sharding
