// Comm: the only place where collectives are issued.
//
// Ops (N = world size, r = this rank, S = shard elements):
//   all_reduce      t [*]                 in place, sum / avg / max / min over ranks
//   all_gather      in [S] -> out [N*S]    out[k*S:(k+1)*S] = in of rank k
//   reduce_scatter  in [N*S] -> out [S]    out = reduce over ranks of in[r*S:(r+1)*S]
//   broadcast       t [*]                 in place, from `root`
//   all_to_all      in [sum(in_splits), *] -> out [sum(out_splits), *]: in's k-th run of
//                   in_splits[k] rows goes to rank k, out's k-th run of out_splits[k] rows
//                   comes from rank k (variable splits, rows along dim 0; expert parallelism)
//   barrier
// Every op has an async form returning a Work; the sync form is async + wait(). Tensors
// must be contiguous; out and in of all_gather / reduce_scatter have the same dtype
// and device. `in` of all_gather may alias out's own slice (FSDP's shard-in-buffer case).
//
// How each op is issued on Gloo (TCP), chosen by measurement against LibTorch 2.11's own
// Gloo ops (scripts/bench/gloo_ops.py; docs/notes/cpu_comm.md has the numbers):
//   * all-gather             -> one broadcast per rank of its slice, into views of `out`
//                               (2-5x faster than Gloo's all_gather_into_tensor, which, like
//                               its list allgather, stages through a buffer per call)
//   * reduce-scatter         -> all-to-all of `in`'s N chunks (chunk k to rank k, 2-byte
//                               floats as raw bytes), then a local reduce of the N chunks
//                               received (2-byte floats in fp32); Gloo's reduce_scatter_tensor
//                               was never faster
//   * all-reduce             -> Gloo's own, 2-byte floats included (bf16 natively: 1.6-5x
//                               faster than reducing a fp32 copy; partial sums round to
//                               bf16 at world > 2, as on NCCL)
//   * 2-byte floats in all-gather / broadcast travel bit-exact as raw bytes (uint8)
//   * avg                    -> sum, then divide by N (every backend, for identical numerics)
//   * all-to-all             -> Gloo's alltoall_base with split sizes on the raw bytes (uint8,
//                               splits x row bytes; any dtype, bit-exact); NCCL's natively.
//                               The shared-memory channel has no all-to-all: with it attached,
//                               all-to-alls still go over the comm's own Gloo group (TCP),
//                               which every rank does alike, so nothing mismatches or hangs
// With NCCL the native flat ops are used. CUDA tensors on Gloo (two ranks sharing one GPU,
// where NCCL refuses to run) are staged through host copies, synchronously, and copied back
// when the op is waited.
// When every rank is on one host and VLMTRAIN_SHM_COMM=1 opts in, ParallelDims gives Gloo
// jobs a shared-memory channel (sharding/dist/shm_channel.h) and every op goes there
// instead: flat ops and 2-byte float reductions (in fp32) natively, a plain copy instead of
// TCP over loopback.
//
// Byte counters, per op kind, per rank (M = bytes of the full flat tensor in the op's
// dtype: the all-reduced tensor, all-gather's `out`, reduce-scatter's `in`):
//   logical_bytes: what the op moves natively with a ring algorithm:
//       all_reduce 2(N-1)/N * M, all_gather (N-1)/N * M, reduce_scatter (N-1)/N * M,
//       broadcast M (each non-root rank receives the tensor once; root counts the same
//       so all ranks agree), all_to_all: the bytes this rank sends to other ranks
//       (sum over k != r of in_splits[k] x row bytes; the rows to itself are a local copy;
//       ranks differ), barrier 0. World size 1: 0 for every op.
//   wire_bytes: the same ring formulas applied to what was really issued. The
//       reduce-scatter's all-to-all and the all-gather's broadcasts move the ring volume
//       (N-1)/N * M (the broadcasts: per rank, averaged over the ranks). The shared-memory
//       channel reads what the ring would send (its wire bytes equal the logical bytes).
//       all_to_all's wire bytes equal its logical bytes.
// Bytes are doubles (2(N-1)/N * M is not always an integer); exact below 2^53.
//
// Errors: a failure or timeout in issue or wait throws vlm::Error naming the op, rank,
// sequence number, tensor shape/dtype, the caller's context string (e.g.
// "step 12, unit model.layers.3"), the underlying reason, and the flight recorder (the
// last ops this rank entered and completed). The Comm must outlive its Work handles.
// With a store (ParallelDims sets the rendezvous store), a failing rank also publishes the
// last op it entered under "vlm_comm/<plane>/last_op/<rank>" and waits up to peer_report_wait (5 s)
// for the other ranks' reports, so each error ends with what every rank last entered
// (a rank that is dead or stuck outside the comm layer shows as "no report"). The extra
// wait keeps a failing rank's exit within the collective timeout + 30 s.
#pragma once
#include <torch/torch.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sharding/dist/parallel_dims.h"

namespace c10d {
class Work;
}

namespace vlm::sharding {

class ShmChannel;
struct ShmTask;

enum class OpKind { kAllReduce = 0, kAllGather, kReduceScatter, kBroadcast, kBarrier, kAllToAll };
constexpr int kNumOpKinds = 6;
const char* op_name(OpKind op);

enum class ReduceOp { kSum, kAvg, kMax, kMin };

struct OpStats {
  int64_t calls = 0;
  double logical_bytes = 0;  // native ring volume per rank (see header comment)
  double wire_bytes = 0;     // ring volume of what the fallback really issued
  double wait_s = 0;         // seconds this rank blocked in Work::wait (exposed comm time,
                             // epilogue included); issue time is not counted
};

struct CommStats {
  std::array<OpStats, kNumOpKinds> ops{};
  const OpStats& operator[](OpKind op) const { return ops[static_cast<int>(op)]; }
  OpStats& operator[](OpKind op) { return ops[static_cast<int>(op)]; }
  double logical_bytes() const;  // summed over op kinds
  double wire_bytes() const;
  double wait_s() const;
  int64_t calls() const;
};

// One entry of the flight recorder.
struct FlightEntry {
  enum class State { kEntered, kCompleted, kFailed };
  uint64_t seq = 0;
  OpKind op = OpKind::kBarrier;
  std::string what;     // shape, dtype, fallback used
  std::string context;  // caller's context
  State state = State::kEntered;
  double ms = 0;        // duration once completed / failed
  std::string to_string() const;
};

class Comm;
class CommWatchdog;  // comm_watchdog.h

// Handle of an issued collective. wait() blocks, applies the fallback's epilogue (copy
// back, cast, slice, divide) and throws vlm::Error on failure or timeout. Waiting twice is
// a no-op; a handle never waited does not finish its epilogue (the output is undefined).
class Work {
 public:
  Work() = default;  // an already-completed no-op
  Work(Work&&) = default;
  Work& operator=(Work&&) = default;
  Work(const Work&) = delete;  // the epilogue must run once
  Work& operator=(const Work&) = delete;
  void wait();
  bool done() const { return done_; }

 private:
  friend class Comm;
  Comm* comm_ = nullptr;
  uint64_t seq_ = 0;
  OpKind op_ = OpKind::kBarrier;
  std::string head_;  // "all_reduce #12 [1000] Float (context: ...)" for errors
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::shared_ptr<ShmTask> shm_;  // the op on the shared-memory channel, if it went there
  std::function<void()> epilogue_;
  bool done_ = true;
};

class Comm {
 public:
  // `group` may be null only for world_size 1 (every op is then local).
  Comm(c10::intrusive_ptr<c10d::Backend> group, int rank, int world_size,
       Backend backend, std::chrono::milliseconds timeout, size_t flight_capacity = 32);
  ~Comm();  // joins the shared-memory channel's thread, if any

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  Backend backend() const { return backend_; }

  // The plane this comm carries ("data" or "control", see ParallelDims), named in every
  // error; `other` is the other plane, whose last ops each error also lists (a peer that
  // died in a data-plane op shows up there when the control plane times out). `other` must
  // outlive this comm.
  void set_plane(std::string plane, const Comm* other) {
    plane_ = std::move(plane);
    other_ = other;
  }
  const std::string& plane() const { return plane_; }

  // t: [*] contiguous, float/bf16/fp16/int; in place.
  Work all_reduce_async(const torch::Tensor& t, ReduceOp op, const std::string& ctx);
  void all_reduce(const torch::Tensor& t, ReduceOp op, const std::string& ctx) {
    all_reduce_async(t, op, ctx).wait();
  }
  // in: [S], out: [N*S]; same dtype.
  Work all_gather_async(const torch::Tensor& out, const torch::Tensor& in, const std::string& ctx);
  void all_gather(const torch::Tensor& out, const torch::Tensor& in, const std::string& ctx) {
    all_gather_async(out, in, ctx).wait();
  }
  // in: [N*S], out: [S]; same dtype. `in` is not modified, and must stay unmodified until
  // wait() (the Gloo fallback sends from it without a copy).
  Work reduce_scatter_async(const torch::Tensor& out, const torch::Tensor& in, ReduceOp op,
                            const std::string& ctx);
  void reduce_scatter(const torch::Tensor& out, const torch::Tensor& in, ReduceOp op,
                      const std::string& ctx) {
    reduce_scatter_async(out, in, op, ctx).wait();
  }
  // t: [*] contiguous; in place from rank `root`.
  Work broadcast_async(const torch::Tensor& t, int root, const std::string& ctx);
  void broadcast(const torch::Tensor& t, int root, const std::string& ctx) {
    broadcast_async(t, root, ctx).wait();
  }
  void barrier(const std::string& ctx);
  // in: [sum(in_splits), *], out: [sum(out_splits), *] (same dtype, device and row shape;
  // contiguous); in_splits / out_splits: world_size row counts each. Every rank must pass
  // out_splits[k] == rank k's in_splits[r] (the caller exchanges counts first, e.g. with an
  // all_to_all of the counts themselves); a rank with no rows still takes part. `in` must
  // stay unmodified until wait(). (comm_all_to_all.cpp)
  Work all_to_all_async(const torch::Tensor& out, const torch::Tensor& in, const std::vector<int64_t>& out_splits,
                        const std::vector<int64_t>& in_splits, const std::string& ctx);
  void all_to_all(const torch::Tensor& out, const torch::Tensor& in, const std::vector<int64_t>& out_splits,
                  const std::vector<int64_t>& in_splits, const std::string& ctx) {
    all_to_all_async(out, in, out_splits, in_splits, ctx).wait();
  }

  // The store used to exchange last-op reports on failure (see the header comment);
  // null disables the exchange.
  void set_store(c10::intrusive_ptr<c10d::Store> store,
                 std::chrono::milliseconds peer_report_wait = std::chrono::seconds(5)) {
    store_ = std::move(store);
    peer_report_wait_ = peer_report_wait;
  }

  // Routes every later op through `channel` (shared memory between the ranks of one host,
  // sharding/dist/shm_channel.h); null keeps the process group. `note` says why for the log.
  void set_shm(std::shared_ptr<ShmChannel> channel, std::string note);
  // "shared memory (...)" or "gloo (tcp)": for the start-up log.
  const std::string& transport() const { return transport_; }

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }
  // The last ops (oldest first), one per line.
  std::string flight_record() const;

  // Starts the watchdog (comm_watchdog.h) over every later op issued to the process group:
  // an op not completed within the timeout, or completed with an error, ends in
  // `on_timeout(report)`, the report being what a failed wait() would throw. Needed where
  // wait() does not block the host until the op is done (NCCL); ParallelDims starts it there.
  void start_watchdog(std::function<void(const std::string&)> on_timeout,
                      std::chrono::milliseconds poll = std::chrono::milliseconds(100));
  bool watchdog_running() const { return watchdog_ != nullptr; }

 private:
  friend class Work;
  uint64_t enter(OpKind op, const std::string& what, const std::string& ctx);
  void complete(uint64_t seq);
  [[noreturn]] void fail(uint64_t seq, const std::string& head, const std::string& reason);
  // fail()'s message (marks the op failed in the flight recorder, collects the peers' reports).
  std::string failure_report(uint64_t seq, const std::string& head, const std::string& reason);
  void count(OpKind op, double logical, double wire);
  // Publishes this rank's last op to the store and collects the others' (best effort).
  std::string peer_report(uint64_t failed_seq);
  // Runs `issue` (which returns the c10d works) and wraps its exceptions.
  Work launch(uint64_t seq, const std::function<std::vector<c10::intrusive_ptr<c10d::Work>>()>& issue,
              std::function<void()> epilogue);

  Work launch_shm(uint64_t seq, std::shared_ptr<ShmTask> task);
  // CUDA tensors on Gloo (or shared memory) travel through host copies: whether `t` must,
  // and the Work of the op on the copies with `copy_back` appended to its epilogue.
  bool stage_on_host(const torch::Tensor& t) const;
  Work staged(Work w, std::function<void()> copy_back);

  c10::intrusive_ptr<c10d::Backend> group_;
  std::string plane_ = "data";
  const Comm* other_ = nullptr;
  std::shared_ptr<ShmChannel> shm_;
  std::string transport_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds peer_report_wait_{0};
  int rank_ = 0;
  int world_ = 1;
  Backend backend_ = Backend::kNone;
  std::chrono::milliseconds timeout_;
  CommStats stats_;
  mutable std::mutex mu_;  // guards the flight recorder
  std::deque<FlightEntry> flight_;
  std::deque<std::chrono::steady_clock::time_point> flight_start_;
  size_t flight_capacity_;
  uint64_t next_seq_ = 0;
  std::unique_ptr<CommWatchdog> watchdog_;  // last: stopped first on destruction
};

}  // namespace vlm::sharding
