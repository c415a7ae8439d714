// ShmChannel: collectives between the ranks of one host through shared memory, for CPU
// tensors, opt-in (VLMTRAIN_SHM_COMM=1). Comm routes every op here when the channel is up
// (Gloo backend, every rank on this host); Gloo's TCP over loopback spent ~15% of each
// rank's CPU time in the kernel in the small FSDP bench (copies, softirqs, wake-ups:
// docs/notes/cpu_comm.md), where this path does plain memcpy and a local reduce.
//
// Layout: each rank owns one segment in /dev/shm (unlinked as soon as every rank mapped
// it, so nothing is left behind): a control block (round counters, a descriptor of what
// was posted, the owner's pid) and two data buffers of kBufferBytes. Ops run one at a
// time, in issue order, on one progress thread per process; an op is a sequence of rounds.
// Round k (k = 1, 2, ...) uses buffer k % 2 of every rank:
//   1. wait until every peer finished reading round k-2 (its buffer k % 2 is free again);
//   2. write this rank's part into its own buffer, describe it (op, bytes, op index),
//      then posted = k;
//   3. wait until every peer posted k and check that its descriptor equals this rank's:
//      ranks in different ops (a collective mismatch) get an error naming both sides,
//      never a hang or mixed-up data;
//   4. read / reduce from the peers' buffers, then done = k.
// The ops as rounds (C = kBufferBytes, N ranks, r = this rank):
//   all_gather      per C-byte piece of `in`: post it; copy the peers' pieces into `out`.
//   reduce_scatter  per piece of the shard: post the N-1 pieces the peers own; reduce this
//                   rank's own piece of `in` with theirs into `out` (in rank order).
//   all_reduce      per piece, two rounds: post the peers' slices of it; reduce slice r
//                   over all ranks into `t`; post that slice; copy the peers' slices into `t`. Each
//                   element is reduced once, by one rank, so all ranks end bit-identical.
//   broadcast       per piece: the root posts, the others copy.
//   barrier         one round without data.
// 2-byte floats are reduced in fp32 (as the Gloo fallbacks do), avg divides the sum by N.
// Waiting: a short spin, then futex sleeps on the peer's counter (the poster wakes them).
// Sleeps are bounded so the waiter sees the deadline (the comm timeout, per op), a closing
// channel, and whether the peer's process still exists: a dead peer fails the op within
// ~0.2 s. After a failure the channel is broken: every later op fails with the first error.
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sharding/dist/comm.h"

namespace c10d {
class Store;
}

namespace vlm::sharding {

// One op handed to the progress thread.
struct ShmTask {
  enum class Kind : uint32_t { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast, kBarrier };
  Kind kind = Kind::kBarrier;
  torch::Tensor a;  // all_reduce / broadcast: t; all_gather / reduce_scatter: out
  torch::Tensor b;  // all_gather / reduce_scatter: in
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  uint64_t index = 0;  // the op's position on this channel (same on every rank)

  // Blocks until the progress thread finished the op; throws std::runtime_error with the
  // reason when it failed.
  void wait();

 private:
  friend class ShmChannel;
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  std::string error_;
};

class ShmChannel {
 public:
  static constexpr size_t kBufferBytes = size_t{2} << 20;  // per buffer; 2 per rank

  // Collective: every rank of the group calls it. Returns null, with the reason in
  // *why_not, when shared memory cannot be used (ranks on more than one host or in
  // different containers, /dev/shm missing or full); the ranks agree through `store`, so
  // either all get a channel or none does. `host_id` stands in for this process's host
  // identity (boot id, IPC and pid namespaces, /dev/shm) when not empty: tests use it.
  static std::shared_ptr<ShmChannel> create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int world, std::chrono::milliseconds timeout,
                                            std::string* why_not, const std::string& host_id = "");
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  // Same contracts as Comm's ops (shapes checked there); tensors are CPU and contiguous.
  // t: [*] in place
  std::shared_ptr<ShmTask> all_reduce(const torch::Tensor& t, ReduceOp op);
  // in: [S] -> out: [N*S] (in may alias out's own slice)
  std::shared_ptr<ShmTask> all_gather(const torch::Tensor& out, const torch::Tensor& in);
  // in: [N*S] -> out: [S]; in is only read, and must stay unchanged until wait()
  std::shared_ptr<ShmTask> reduce_scatter(const torch::Tensor& out, const torch::Tensor& in, ReduceOp op);
  // t: [*] in place, from rank `root`
  std::shared_ptr<ShmTask> broadcast(const torch::Tensor& t, int root);
  std::shared_ptr<ShmTask> barrier();

  // For logs: "shared memory (/dev/shm, 4 MiB per rank)".
  std::string describe() const;

 private:
  struct Control;
  struct Segment {
    std::string name;        // shm name; empty once unlinked
    void* base = nullptr;
    size_t bytes = 0;
  };

  ShmChannel(int rank, int world, std::chrono::milliseconds timeout, std::vector<Segment> segs);
  std::shared_ptr<ShmTask> submit(std::shared_ptr<ShmTask> t);
  void loop();
  void run(ShmTask& t);
  void run_all_gather(ShmTask& t);
  void run_reduce_scatter(ShmTask& t);
  void run_all_reduce(ShmTask& t);
  void run_broadcast(ShmTask& t);

  // One round (see the header comment): fill(my_buffer) writes this rank's part,
  // consume(buffer_index) reads the peers' buffers.
  template <typename Fill, typename Consume>
  void round(const ShmTask& t, uint64_t bytes, Fill&& fill, Consume&& consume);
  void await(int peer, std::atomic<uint32_t>& word, uint32_t target, const ShmTask& t, const char* what);
  void check_descriptor(int peer, int buf, uint32_t k, const ShmTask& t, uint64_t bytes) const;

  Control* ctrl(int r) const;
  char* buffer(int r, int b) const;

  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  std::vector<Segment> segs_;  // by rank; segs_[rank_] is this rank's own
  uint64_t round_ = 0;         // rounds run so far (progress thread only)
  uint64_t next_index_ = 0;    // ops submitted so far
  std::chrono::steady_clock::time_point op_start_;

  std::mutex mu_;  // guards queue_ and stop_'s transitions
  std::condition_variable cv_;
  std::deque<std::shared_ptr<ShmTask>> queue_;
  std::atomic<bool> stop_{false};
  std::string broken_;  // first failure (progress thread only)
  std::thread thread_;
};

}  // namespace vlm::sharding
