// Optimizer state offload: host buffers, copy fences, the host update thread (see offload.h).
#include "sharding/parallel/offload.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

#include "vlm/runtime/check.h"

namespace vlm::sharding {

c10::cuda::CUDAStream offload_stream(c10::DeviceIndex index) {
  static std::mutex mu;
  static std::map<c10::DeviceIndex, cudaStream_t> streams;  // process lifetime: never destroyed
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find(index);
  if (it == streams.end()) {
    c10::cuda::CUDAGuard guard(index);
    cudaStream_t s = nullptr;
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    it = streams.emplace(index, s).first;
  }
  return c10::cuda::getStreamFromExternal(it->second, index);
}

torch::Tensor host_zeros(int64_t n, torch::Device device) {
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU);
  if (device.is_cuda()) opts = opts.pinned_memory(true);
  return torch::zeros({n}, opts);
}

CopyFence CopyFence::record(torch::Device device) {
  CopyFence f;
  if (!device.is_cuda()) return f;
  auto ev = std::make_shared<at::cuda::CUDAEvent>();
  ev->record(c10::cuda::getCurrentCUDAStream(device.index()));
  f.event_ = ev;
  return f;
}

void CopyFence::wait() const {
  if (event_) static_cast<at::cuda::CUDAEvent*>(event_.get())->synchronize();
}

void copy_back(const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& src) {
  VLM_ASSERT(dst.size() == src.size(), "offload copy_back: ", dst.size(), " targets, ", src.size(), " sources");
  if (dst.empty()) return;
  const torch::Device device = dst.front().device();
  if (!device.is_cuda()) {
    at::_foreach_copy_(dst, src);
    return;
  }
  c10::cuda::CUDAGuard guard(device);
  c10::cuda::CUDAStream side = offload_stream(device.index());
  c10::cuda::CUDAStreamGuard on_side(side);
  std::vector<torch::Tensor> staged;  // alive until the copies are done
  for (size_t i = 0; i < dst.size(); ++i) {
    VLM_ASSERT(dst[i].device() == device, "offload copy_back: targets on ", device.str(), " and ",
               dst[i].device().str());
    torch::Tensor from = src[i];
    if (from.scalar_type() != dst[i].scalar_type()) {
      // A low-precision parameter: round on the host into pinned memory (half the bytes
      // over the bus, and the copy stays asynchronous).
      staged.push_back(torch::empty(from.sizes(), from.options().dtype(dst[i].scalar_type()).pinned_memory(true)));
      staged.back().copy_(from);
      from = staged.back();
    }
    dst[i].copy_(from, /*non_blocking=*/true);
  }
  side.synchronize();  // done before the task counts as done: the next gather reads dst
}

HostUpdateQueue::HostUpdateQueue() : thread_([this] { loop(); }) {}

HostUpdateQueue::~HostUpdateQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t HostUpdateQueue::submit(std::function<void()> work) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(work));
  const int64_t ticket = ++submitted_;
  cv_.notify_all();
  return ticket;
}

void HostUpdateQueue::wait(int64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  VLM_ASSERT(ticket <= submitted_, "offload: wait for ticket ", ticket, " of ", submitted_, " submitted");
  cv_.wait(lock, [&] { return finished_ >= ticket; });
  if (error_) std::rethrow_exception(error_);
}

int64_t HostUpdateQueue::submitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return submitted_;
}

int64_t HostUpdateQueue::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

void HostUpdateQueue::loop() {
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      if (const int64_t ms = delay_ms_.load(); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      torch::NoGradGuard no_grad;  // grad mode is per thread
      work();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error && !error_) error_ = error;
      ++finished_;
    }
    cv_.notify_all();
  }
}

}  // namespace vlm::sharding
