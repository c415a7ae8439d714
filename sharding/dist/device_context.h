// DeviceContext: the one owner of a rank's device, its copy stream and pinned staging.
//
//   DeviceContext dev(dims.device());      // makes the device current in this thread
//   vlm::Batch b = dev.to_device(host);     // pinned + non-blocking copy on the copy stream
//   model->forward(b);                      // compute stream already waits for the copy
//
// On CUDA: the calling thread's current device is set at construction; other threads that
// allocate (loader staging, autograd hooks run on autograd's device threads, which set their
// own) call bind_thread(). to_device() pins each host tensor (the caching host allocator
// keeps it alive until its copy has run), allocates the device tensor on the copy stream,
// copies with non_blocking = true there, records an event, makes the current (compute)
// stream wait for it, and marks the tensor as used by the compute stream so the caching
// allocator does not hand its memory back to the copy stream while compute may still read
// it. Copies issued while the previous step's kernels still run overlap them.
// On CPU every call is a no-op and to_device() returns the same tensors.
// Nothing else in vlmtrain calls set_device.
#pragma once
#include <torch/torch.h>

#include <memory>

#include "vlm/model/vision_language_model.h"

namespace vlm::sharding {

// Device memory of a rank, from the CUDA caching allocator (zeros on CPU).
// Tensor bytes on the rank's device: on CUDA the caching allocator's statistics, on the CPU
// vlm::TensorMemoryMeter's (zeros unless it is installed, as vlmtrain's main does).
struct DeviceMemory {
  int64_t allocated = 0;       // bytes in tensors now
  int64_t peak_allocated = 0;  // their peak since the process started or reset_peak()
  int64_t reserved = 0;        // bytes the allocator holds from the driver now
  // CUDA: the cuBLAS / cuBLASLt workspaces PyTorch holds (part of `allocated`), one per
  // (thread's handle, stream) that has run a matmul: their bytes and count.
  int64_t blas_workspace_bytes = 0;
  int64_t blas_workspaces = 0;
};

class DeviceContext {
 public:
  explicit DeviceContext(torch::Device device);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  torch::Device device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  // Makes this context's device current in the calling thread (no-op on CPU).
  void bind_thread() const;

  // A host tensor on the device, ready for the compute stream (see the header comment).
  torch::Tensor to_device(const torch::Tensor& host);
  // The tensors of a host micro-batch on the device (undefined stay undefined), except
  // image_grid_thw, which stays on the host: the vision tower reads it there to plan its
  // attention (cu_seqlens, windows), so keeping it avoids a device -> host sync.
  vlm::Batch to_device(const vlm::Batch& host);

  DeviceMemory memory() const;
  // Starts a new peak of DeviceMemory::peak_allocated (e.g. once per training step).
  void reset_peak() const;
  // Waits until all work queued on this device is done (a no-op on the CPU). Start-up only:
  // the training step never calls it.
  void synchronize() const;

  // Bytes copied host -> device so far, and how many copies.
  int64_t copied_bytes() const { return copied_bytes_; }
  int64_t copies() const { return copies_; }

 private:
  struct Cuda;  // streams and events (only on CUDA)
  torch::Device device_;
  std::unique_ptr<Cuda> cuda_;
  int64_t copied_bytes_ = 0;
  int64_t copies_ = 0;
};

}  // namespace vlm::sharding
