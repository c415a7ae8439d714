// FSDP runtime: flat parameters, sharded over the ranks, gathered around each unit's
// forward and backward, gradients reduce-scattered into the local shard.
//
// Names: N world size, r this rank, P a unit's parameter elements (registration order),
// S = ceil(P / N) shard elements, R_r = [r*S, min((r+1)*S, P)) the owned range (the same
// ceil split as optimizer.h's owned_range, padding only at the end of the last shards).
//
// One FsdpUnit per unit with sharding kFullShard, kShardGradOp, kHybridShard or kFrozenSharded:
//   full    [N*S]  param dtype  the gathered flat parameter; every parameter of the unit
//                               is set_data() to a view of it. Its storage is released
//                               (StorageImpl data pointer emptied, nbytes 0) while the unit
//                               is not gathered and reallocated with the storage's own
//                               allocator before the next all-gather, so the parameter
//                               tensors, and the tensors autograd saved from them, stay
//                               valid and are refilled in place. While released, any
//                               read or write of the storage's data (a parameter touched
//                               outside a gather: eval outside the runner, state_dict,
//                               printing) throws a c10::Error that names the unit and the
//                               way out (gather_all / release_all), instead of reading
//                               through a null pointer.
//   local  [S]     param dtype  this rank's shard of the parameters (persistent; the
//                               optimizer writes its update here; zeros in the padding).
//   grad   [S]     fp32         this rank's reduced gradient, accumulated over the
//                               micro-batches of a step (trainable units only).
//
// Life of a unit in one micro-batch (the runner calls pre_forward, mark_input, post_forward):
//   pre_forward    gather (or wait the prefetch), then prefetch (async all-gather) the
//                  next two FSDP units in call order
//   mark_input     when the unit's input needs a gradient, wrap it in an identity autograd
//                  node whose backward is the unit's post-backward signal (as FSDP2's
//                  RegisterPostBackwardFunction)
//   post_forward   full_shard / frozen: free, except the last FSDP call of the forward when
//                  its output needs a gradient (its backward runs first: kept gathered).
//                  shard_grad_op: keep gathered for backward (free at once when the output
//                  needs no gradient). If the output needs a gradient, wrap it in an
//                  identity autograd node whose backward is the unit's pre-backward hook.
//   pre_backward   gather again if freed (or wait the prefetch), prefetch the previous FSDP
//                  unit in call order that takes part in backward, and the one before it.
//   post_backward  the input's gradient is complete, so nothing of this call's backward
//                  reads the weights any more: free a full_shard / frozen unit (a unit
//                  called twice, once every call with a signal is done). Units whose input
//                  needs no gradient (the first units) get no signal: their
//                  reduce-scatter frees them (trainable), or they have no backward.
//   grads ready    a post-hook on each parameter's AccumulateGrad node counts the unit's
//                  parameters; when all have their gradient, the unit's reduce-scatter
//                  (SUM, reduce dtype) of [N*S] into [S] is launched, the parameters' .grad
//                  are dropped and the unit is freed. Launches are strictly in reverse unit
//                  order (a ready unit waits for the ones after it), so every rank issues
//                  the same collectives in the same order.
//   finish_backward (the trainer's call after every micro-batch's backward, which plays the
//                  end-of-backward callback): launches the reduce-scatters of the units that
//                  got no gradient (zeros), waits all of them, adds each result into `grad`
//                  (fp32), and frees every unit still gathered.
// Gradient accumulation, two ways (set_accumulate_unsharded; recipe sharding.fsdp_accumulate):
//   sharded (default)  every micro-batch reduce-scatters into the fp32 shard grad, where the
//                      micro-batches' sums accumulate; set_sync does not apply.
//   unsharded          the micro-batches before the last of a step (set_sync(false)) issue no
//                      collective: when a unit's gradients are ready they are added into an
//                      unsharded accumulator acc [N*S] (reduce dtype) and the unit is freed;
//                      the last micro-batch (set_sync(true)) adds its own gradients and
//                      reduce-scatters acc once (FSDP2's set_requires_gradient_sync(False)).
//                      Traffic per step: one reduce-scatter per unit instead of one per
//                      micro-batch; memory: N*S x reduce dtype per trainable unit from its
//                      first backward of the step until its reduce-scatter (memory_plan.h).
//
// Traffic per micro-batch and unit (M = N*S elements x dtype bytes, Comm's logical ring
// volume): full_shard 2 all-gathers + 1 reduce-scatter = 3(N-1)/N M, except the unit of the
// last call (kept from its forward into its backward): 1 + 1; shard_grad_op 1 + 1 =
// 2(N-1)/N M; frozen sharded 1 all-gather (2 when its backward is needed). A unit called
// twice (tied lm_head = model.embed_tokens) under full_shard is gathered for each call:
// forward embed, forward lm_head (kept): 2 all-gathers + 1 reduce-scatter, as every other
// unit. An embedding's backward never reads its table, so model.embed_tokens is not gathered
// for it (skip_backward_gather; unless it is checkpointed: the recompute reads it): untied,
// it costs 1 all-gather + 1 reduce-scatter.
// Peak: under full_shard at most three units are gathered at once (the running unit and the
// two prefetched ones; tested), at most the three largest units' bytes (memory_plan.h). The
// second look-ahead hides a gather behind more than one unit's compute, which matters when
// the next unit computes little (model.norm before the head, model.embed_tokens after the
// merger): on the small preset at world 2 the forward prefetch of model.embed_tokens alone
// was 23 ms of exposed wait per step with one look-ahead. shard_grad_op keeps
// every unit gathered from its forward to its reduce-scatter. Freeing in backward follows
// each unit's own post-backward signal, not the call order: a unit whose output feeds
// several later units (DeepStack mergers, a branched merger) is freed when its own backward
// is over, whatever order autograd runs the branches in (tests/sharding/parallel/fsdp_branch_dist_test.cpp).
//
// Hybrid sharding (kHybridShard, HSDP): a full_shard unit whose N and r above are its shard group's (dp_shard
// ranks, ParallelDims' mesh), whose own lanes carry its all-gathers and reduce-scatters. After
// the reduce-scatter the [S] shard grad holds the sum over the group only; on the synced
// micro-batch (set_sync(true), the last of a step) each unit's fp32 shard grad is all-reduced
// (SUM) across the dp_replicate replicas of its shard, async, in reduce-scatter order, on the
// replicate comm, and waited in finish_backward: one all-reduce of S x 4 bytes per unit and
// step over the slow link, whatever the number of micro-batches. (If every micro-batch is
// synced, each one all-reduces its own reduce-scatter output: correct, more traffic.) The
// optimizer then updates the same shard identically on every replica. Every replica holds
// the whole R_r: for the grad norm and checkpoints each counts / writes only its 1/dp_replicate
// part of it, own_lo()..own_hi(), so nothing is counted or written twice.
//
// Eval / generation: under NoGradGuard each call gathers and frees its unit (every rank
// must make the same calls, e.g. the same number of decoding steps); gather_all() keeps
// everything gathered instead.
//
// Hang safety: every decision that issues a collective (gather, prefetch, reduce-scatter
// order) depends only on the call order and on whether outputs need gradients, which are
// the same on every rank when every rank runs every unit (docs/design.md, invariant 2). The
// all-gathers and the reduce-scatters go over separate comms (ParallelDims' lanes kGather
// and kReduce), and DDP's buckets over a third: each stream of ops is in a fixed order on
// every rank, while how the streams interleave (set by autograd's schedule, which differs
// between ranks whose graphs differ) does not have to agree (tests/sharding/dist/lanes_dist_test.cpp).
#pragma once
#include <torch/torch.h>

#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "sharding/dist/comm.h"
#include "sharding/parallel/policy.h"

namespace torch::autograd {
struct Node;
}

namespace vlm::sharding {

class FsdpUnit {
 public:
  const std::string& path() const { return path_; }
  bool trainable() const { return trainable_; }
  Sharding sharding() const { return sharding_; }
  int64_t numel() const { return numel_; }  // P
  int64_t shard() const { return shard_; }  // S
  int64_t lo() const { return lo_; }        // R_r
  int64_t hi() const { return hi_; }
  // The part of R_r this rank counts in the grad norm and writes to checkpoints: all of it,
  // or under hybrid_shard its replica's 1/dp_replicate share (see the header comment).
  int64_t own_lo() const { return own_lo_; }
  int64_t own_hi() const { return own_hi_; }
  int64_t group_size() const { return gather_comm_->world_size(); }  // N: the ranks sharing the unit
  const std::vector<UnitParam>& params() const { return params_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }  // flat offset of each param
  // [hi - lo] param dtype: view of this rank's owned parameter elements.
  torch::Tensor shard_param() const { return local_.narrow(0, 0, hi_ - lo_); }
  // [hi - lo] fp32: view of this rank's reduced gradient (zeros before any backward).
  torch::Tensor shard_grad() const { return grad_.defined() ? grad_.narrow(0, 0, hi_ - lo_) : torch::Tensor(); }
  bool gathered() const { return state_ != State::kFree; }
  // Bytes of the gathered flat buffer (N*S x param dtype).
  double gathered_bytes() const;
  // Persistent bytes on this rank: local shard, shard grad.
  double shard_param_bytes() const;
  double shard_grad_bytes() const;
  // Bytes of the reduce-scatter buffers while in flight: input [N*S] + output [S], reduce dtype.
  double reduce_scatter_bytes() const { return rs_nbytes_; }
  // Whether parameter k (index into params()) had a gradient on this rank in a micro-batch
  // since the last zero_grad() (trainable units).
  bool had_grad(size_t k) const { return k < had_grad_.size() && had_grad_[k] != 0; }

 private:
  friend class FsdpEngine;
  enum class State { kFree, kGathering, kGathered };
  std::string path_;
  Sharding sharding_ = Sharding::kFullShard;
  bool trainable_ = false;
  std::vector<UnitParam> params_;
  std::vector<int64_t> offsets_;
  int64_t numel_ = 0, shard_ = 0, lo_ = 0, hi_ = 0, own_lo_ = 0, own_hi_ = 0;
  Comm* gather_comm_ = nullptr;     // all-gathers (the world's or the shard group's lane)
  Comm* reduce_comm_ = nullptr;     // reduce-scatters
  Comm* replicate_comm_ = nullptr;  // hybrid_shard with replicas: the shard grad's all-reduce
  Work ar_;                         // that all-reduce, in flight
  bool replica_pending_ = false;    // grad_ holds sums not yet all-reduced across the replicas
  bool replica_synced_ = false;     // grad_ holds sums all-reduced across the replicas
  torch::Tensor full_;   // [N*S] param dtype (storage released while free)
  torch::Tensor local_;  // [S] param dtype
  torch::Tensor grad_;   // [S] fp32 (trainable)
  size_t full_nbytes_ = 0;
  State state_ = State::kFree;
  Work gather_;
  bool needs_backward_ = false;  // an output of this micro-batch needs a gradient
  // Backward bookkeeping (trainable units).
  std::vector<char> fired_;  // per parameter: gradient complete in this micro-batch
  std::vector<char> had_grad_;  // per parameter: a defined .grad since zero_grad()
  double rs_nbytes_ = 0;
  std::string released_msg_;  // the error a read of the released storage throws
  int64_t pending_ = 0;      // parameters not fired yet
  bool rs_launched_ = false;
  Work rs_;
  torch::Tensor acc_;        // [N*S] reduce dtype: unsharded accumulation (no-sync micro-batches)
  torch::Tensor rs_out_;     // [S] reduce dtype
  torch::Tensor rs_in_;      // [N*S] reduce dtype, while the reduce-scatter is in flight
};

// Gathered-buffer accounting (FsdpEngine::gather_stats).
struct GatherStats {
  double bytes = 0;       // gathered now (incl. in-flight prefetches)
  int64_t units = 0;
  double peak_bytes = 0;  // since the last reset_peak()
  int64_t peak_units = 0;
  double rs_bytes = 0;       // reduce-scatter buffers (input + output) alive now
  double rs_peak_bytes = 0;  // their peak since the last reset_peak()
  double acc_bytes = 0;      // unsharded accumulators alive now (accumulate_unsharded)
  double acc_peak_bytes = 0; // their peak since the last reset_peak()
};

// The comms of hybrid_shard units: ParallelDims' shard_comm(kGather), shard_comm(kReduce) and
// replicate_comm().
struct HybridComms {
  Comm* gather = nullptr;
  Comm* reduce = nullptr;
  Comm* replicate = nullptr;
};

// Reduce-scatters a backward keeps in flight at most (see the header comment).
constexpr int kMaxReduceScattersInFlight = 2;

class FsdpEngine {
 public:
  // units: the unit table (units with sharding kFullShard, kShardGradOp, kFrozenSharded
  // become FSDP units; apply_freeze and the rank-0 broadcast must have run). call_order:
  // the model's unit paths in call order (VisionLanguageModelImpl::units(), aliases included), each
  // mapped to its owning unit path. Collective-free; frees every flat buffer at the end.
  // shards: sharded loading's local shards by unit path (sharded_load.h): a unit found there
  // whose parameters are already slices of one [N*S] buffer adopts that buffer and takes
  // the [S] shard as it is (nothing copied); the others are flattened from their values.
  // gather / reduce: the comms of the all-gathers and of the reduce-scatters (ParallelDims'
  // lanes kGather and kReduce: separate groups, so their relative order may differ between
  // ranks; on NCCL separate streams); the same comm for both is allowed. hybrid: the comms
  // of hybrid_shard units (required when there are any).
  FsdpEngine(Comm& gather, Comm& reduce, const std::vector<UnitPlan>& units,
             const std::vector<std::pair<std::string, std::string>>& call_order, torch::Dtype reduce_dtype,
             std::map<std::string, torch::Tensor> shards = {}, HybridComms hybrid = {});
  ~FsdpEngine();
  FsdpEngine(const FsdpEngine&) = delete;
  FsdpEngine& operator=(const FsdpEngine&) = delete;

  // Calls whose backward does not read their unit's parameters (an embedding's): backward
  // neither gathers their unit nor prefetches it for them (calls_without_backward_gather).
  void skip_backward_gather(const std::set<std::string>& call_paths);

  // The FSDP unit a call path runs on (alias-aware), or null.
  FsdpUnit* find(const std::string& call_path);
  FsdpUnit* find_unit(const std::string& unit_path);  // by owning unit path
  const std::vector<std::unique_ptr<FsdpUnit>>& units() const { return units_; }

  // Runner hooks (see the header comment). Calls with a path that is no FSDP unit are no-ops
  // and post_forward returns `out` unchanged.
  void pre_forward(const std::string& call_path);
  torch::Tensor post_forward(const std::string& call_path, const torch::Tensor& out);
  // Gathers the unit of call position `pos` for its backward (idempotent) and prefetches.
  void pre_backward(int64_t pos);
  // The unit's input, wrapped (when it needs a gradient) in an identity autograd node whose
  // backward calls post_backward(position): the runner passes it to the unit's forward.
  torch::Tensor mark_input(const std::string& call_path, const torch::Tensor& x);
  // The unit's backward at call position `pos` is over (its input gradient is complete):
  // frees a full_shard / frozen unit once every call of it that signals is done.
  void post_backward(int64_t pos);
  int64_t position(const std::string& call_path) const;  // -1 if unknown
  // End of a micro-batch's backward (see the header comment).
  void finish_backward(const std::string& ctx);
  // Gradient accumulation (see the header comment): unsharded accumulation on or off (off by
  // default), and whether the next micro-batch is the last of its step (reduce-scatters).
  void set_accumulate_unsharded(bool on) { accumulate_unsharded_ = on; }
  bool accumulate_unsharded() const { return accumulate_unsharded_; }
  void set_sync(bool sync) { sync_ = sync; }
  // Zeros every shard grad (the optimizer's zero_grad).
  void zero_grad();
  // Throws when a hybrid_shard unit's shard grad is not yet summed over the replicas (the
  // optimizer's check before it reads the shard grads).
  void check_reduced(const std::string& ctx) const;
  // Writes `flat` [P] (registration order, any dtype) into the unit's local shard (R_r part).
  void load_params(FsdpUnit& u, const torch::Tensor& flat);

  // Collective: gathers every unit and keeps them gathered (the parameters are then
  // readable and writable as in an unsharded model: tests, export, generation on every
  // rank) until release_all(), which frees them (local). Writes to gathered parameters
  // are lost: the local shard is the source of truth.
  void gather_all(const std::string& ctx);
  void release_all();

  // Called with a unit before each of its all-gathers is issued (optimizer offload: waits
  // for the unit's host update, offload.h); empty: nothing.
  void set_before_gather(std::function<void(FsdpUnit&)> f) { before_gather_ = std::move(f); }

  const GatherStats& gather_stats() const { return gstats_; }
  void reset_peak() {
    gstats_.peak_bytes = gstats_.bytes;
    gstats_.peak_units = gstats_.units;
    gstats_.rs_peak_bytes = gstats_.rs_bytes;
    gstats_.acc_peak_bytes = gstats_.acc_bytes;
  }
  // Throws vlm::Error naming the unit when `t` lies in a released unit's flat buffer
  // (the explicit check for code about to read parameters; reads themselves also throw).
  void check_readable(const torch::Tensor& t, const std::string& what) const;

 private:
  void gather_async(FsdpUnit& u, const std::string& why);
  // The next two FSDP units other than `u` from call position `pos` in call order (step +1,
  // forward) or backward's order (step -1: earlier positions whose outputs need a gradient).
  std::vector<FsdpUnit*> ahead(int64_t pos, int step, const FsdpUnit* u) const;
  void wait_gathered(FsdpUnit& u);
  void release(FsdpUnit& u);
  void on_grad_ready(FsdpUnit& u, int64_t param);
  void launch_ready(bool force);
  void launch_rs(FsdpUnit& u);
  void accumulate(FsdpUnit& u);   // this micro-batch's .grad into acc (unsharded accumulation)
  void complete_rs(FsdpUnit& u);  // wait, add into the shard grad, drop the buffers

  torch::Dtype reduce_dtype_;
  std::vector<std::unique_ptr<FsdpUnit>> units_;
  std::map<std::string, FsdpUnit*> by_unit_;
  std::vector<FsdpUnit*> call_units_;    // per call position: its FSDP unit or null
  std::map<std::string, int64_t> call_pos_;
  std::vector<char> pos_needs_bwd_;      // per call position: its output needs a gradient
  std::vector<char> pos_reads_bwd_;      // per call position: its backward reads the parameters
  std::vector<char> pos_input_signal_;   // per call position: its input carries a post-backward hook
  std::vector<char> pos_bwd_done_;       // per call position: its post-backward signal fired
  int64_t last_pos_ = -1;                // the last call position with an FSDP unit
  std::vector<FsdpUnit*> rs_order_;      // trainable units, reverse unit order
  size_t next_rs_ = 0;
  std::vector<FsdpUnit*> rs_inflight_;   // launched, not yet added into their shard grad
  std::vector<FsdpUnit*> ar_inflight_;   // hybrid_shard: replicate all-reduces launched, not waited
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  GatherStats gstats_;
  std::string ctx_ = "step";  // context of the micro-batch in flight (last finish_backward's)
  std::function<void(FsdpUnit&)> before_gather_;
  bool pinned_ = false;  // gather_all() in effect: release() does nothing
  bool accumulate_unsharded_ = false;
  bool sync_ = true;
};

}  // namespace vlm::sharding
