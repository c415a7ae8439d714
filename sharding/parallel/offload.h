// Optimizer state offload (ZeRO-Offload; recipe sharding.optimizer_offload): the host side
// of ShardedAdamW (optimizer.h) when its fp32 masters and AdamW moments live in host memory.
//
// One step of an offloaded unit (ShardedAdamW::step, per trainable unit):
//   1. on the calling thread: each segment's gradient (fp32 [len], after clipping) is copied
//      into the segment's host staging buffer (CUDA: non_blocking into pinned memory on the
//      current stream), then one CopyFence is recorded for the unit;
//   2. HostUpdateQueue::submit: the background thread waits the fence, runs AdamW on the host
//      tensors (ShardedAdamW's blocked CPU kernel: 256K-element pieces on ATen's intra-op
//      threads, the same ops as on a CPU device, so the same bits), and copies the updated
//      masters into the parameter / FSDP local shard (param dtype; CUDA: on a side stream,
//      waited before the task counts as done);
//   3. step() returns without waiting: the host work of unit k overlaps the next forward of
//      the units before it. A unit's update is waited (HostUpdateQueue::wait of its ticket)
//      before anything reads its parameters or state: the FSDP gather of the unit
//      (FsdpEngine::set_before_gather), the first unit call of a forward for the replicated /
//      ZeRO-1 units (PolicyRunner::set_before_call), and ShardedAdamW::wait() for all of them
//      (next step / clip, state_slices, load_state, the trainer's eval).
// The host reads only its staged gradient copies, so zero_grad() right after step() is safe.
// Not overlapped: ZeRO-1 units at world > 1, whose all-gather inside step() sends the update
// (they are queued first, and step() waits for them only).
// Tasks run in submission order on one thread, so waiting for a ticket waits for every
// earlier one too. An exception in a task is rethrown by every later wait.
// Memory per owned state element: host fp32 master + m + v + grad staging (16 B); device:
// none (the on-device optimizer holds (4* + 8) B: memory_plan.h).
#pragma once
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "sharding/parallel/policy.h"

namespace vlm::sharding {

// fp32 [n] zeros in host memory for state that belongs with tensors on `device`: pinned
// (page-locked, so copies to and from the GPU run asynchronously) when it is a CUDA device.
torch::Tensor host_zeros(int64_t n, torch::Device device);

// "The copies issued so far on the current stream of `device` have completed": a CUDA event
// recorded on that stream; on CPU there is nothing to wait for (copies are synchronous).
class CopyFence {
 public:
  static CopyFence record(torch::Device device);
  void wait() const;  // blocks the calling thread until the copies are done

 private:
  std::shared_ptr<void> event_;  // at::cuda::CUDAEvent, null on CPU
};

// dst[i] = src[i] (host fp32 masters -> device parameters in their dtype), done when this
// returns: CPU one foreach copy (the on-device optimizer's write-back, same rounding); CUDA
// non-blocking copies from pinned memory (low-precision targets rounded on the host into a
// pinned staging tensor first) on offload_stream(dst's device), then that stream is
// synchronised.
void copy_back(const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& src);

// The one stream every offload copy-back of CUDA device `index` runs on, created on first use
// and kept for the process: not one of PyTorch's pool streams, which are handed out
// round-robin (32 per device), so a task per unit would after 32 tasks land on streams the
// NCCL lanes or other code also use, and serialise behind their work.
c10::cuda::CUDAStream offload_stream(c10::DeviceIndex index);

// One background thread that runs the host updates in submission order.
class HostUpdateQueue {
 public:
  HostUpdateQueue();
  ~HostUpdateQueue();  // runs what is queued, then joins
  HostUpdateQueue(const HostUpdateQueue&) = delete;
  HostUpdateQueue& operator=(const HostUpdateQueue&) = delete;

  // Queues `work`; returns its ticket (1, 2, ...).
  int64_t submit(std::function<void()> work);
  // Blocks until task `ticket` and every earlier one have run (ticket 0: returns at once);
  // rethrows the first exception a task threw.
  void wait(int64_t ticket);
  void wait_all() { wait(submitted()); }
  int64_t submitted() const;
  int64_t finished() const;  // tickets 1..finished() have run

  // Tests: every task sleeps this long before its work (shows that step() does not wait).
  void set_delay_for_testing(std::chrono::milliseconds d) { delay_ms_ = d.count(); }

 private:
  void loop();
  mutable std::mutex mu_;
  std::condition_variable cv_;  // queue_ grew / finished_ advanced / stop_
  std::deque<std::function<void()>> queue_;
  int64_t submitted_ = 0, finished_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::atomic<int64_t> delay_ms_{0};
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace vlm::sharding
