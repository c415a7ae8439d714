// Sharded AdamW on fp32 masters, with per-parameter lr / weight decay (policy.h groups)
// and global grad-norm clipping.
//
// Each trainable unit's parameters are laid out in one flat index space [P] (registration
// order). With N ranks, rank r owns the range R_r = [r*S, min((r+1)*S, P)), S = ceil(P/N).
//   replicated (ddp):        optimizer state for all of [P] on every rank;
//   ZeRO-1 (shard_optimizer): state only for R_r; after the update, the owned slice is
//                             all-gathered ([N*S] param dtype, one op per unit) into every
//                             rank's parameters.
//   FSDP (ZeRO-2 / ZeRO-3):   state only for R_r; the gradient is the unit's reduced shard
//                             grad (fsdp.h, fp32 [S]), the update is written into the unit's
//                             local parameter shard, which the next forward all-gathers.
//                             Per-parameter lr / weight decay hold inside the flat unit: the
//                             owned range is cut into one segment per parameter it touches.
// Gradients of replicated / ZeRO-1 units come from the DDP reducer (param_grad): with
// low-precision parameters and an fp32 reduce dtype they are fp32 views of its bucket
// buffers, accumulated over micro-batches in fp32 (ddp.h), which clipping scales in place.
// State per parameter segment: fp32 master (a view of the parameter itself when the
// parameter is fp32, else an fp32 copy), m, v (fp32). Per parameter: its AdamW step count t.
// Frozen units have no state. Expert rows (ep, policy.h: kExpert) are replicated over the
// expert-replicate group: full state on every rank for its held experts, R_r taken over that
// group for the norm (so each expert's gradient counts once in the world's sum).
//
// Update = LibTorch's torch::optim::AdamW (decoupled decay, then Adam with bias correction):
//   master *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   master -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps);  param = master
// Like torch.optim.AdamW, a parameter without a gradient is skipped: no decay, no moment
// update, its t does not advance. "Without a gradient" is a global fact: the parameter had
// no gradient on ANY rank since zero_grad() (FSDP: no defined .grad at any of its unit's
// reduce-scatters, fsdp.h; DDP: none at its bucket's launch, ddp.h; otherwise an undefined
// .grad). The per-parameter flags ride on the grad-norm all-reduce, so every rank takes the
// same decision with no extra collective; step() without a clip_grad_norm() since the last
// step / zero_grad() agrees them with one all-reduce of its own.
// Kernels (same math): foreach ops over the segments (torch::_foreach_*, the same
// per-tensor ops in the same order as torch::optim::AdamW, so bitwise equal to it); on CPU
// the same ops run on 256K-element pieces of the segments in one parallel_for (kBlocked: a
// piece stays in cache through all its ops, one memory pass instead of ten; the same bits);
// at::_fused_adamw_ (one multi-tensor kernel per (lr, weight decay) group) where master and
// gradient are fp32 on CPU or CUDA (AdamWKernel::kAuto), or anywhere on request (kFused; it
// rounds differently: within a few fp32 ulps of torch::optim::AdamW per step).
// Clipping = torch::nn::utils::clip_grad_norm_: norm = ||all grads||_2 (every trainable
// parameter of every unit and policy); if clip / (norm + 1e-6) < 1, grads *= that. Each rank
// sums the squares over its ranges R_r (so replicated gradients are not counted N times)
// on their device (CPU: fp64, 256K-element pieces in parallel, summed in a fixed order; a
// device: one _foreach_norm, fp32 accumulation), moves that one fp64 sum to the host, and all-reduces [sum, per-parameter flags] (fp64, CPU) once on the
// control comm; the clip is one _foreach_mul_.
// Offload (ShardingOptions::optimizer_offload, offload.h): masters, m and v live in host
// memory (pinned on CUDA; the master is a separate fp32 copy even for fp32 parameters),
// step() copies the clipped gradients to host staging buffers and queues one host update per
// unit (the blocked CPU kernel, so the same bits as on a CPU device), written back into the
// parameters / FSDP local shards by the host thread; step() returns before that is done.
// Waits: wait_unit() (FSDP gather hook), wait_unsharded() (first unit call of a forward),
// wait() (everything; called by step(), clip_grad_norm(), state_slices(), load_state()).
// The checkpoint side (state_slices, load_state) is in optimizer_state.cpp.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sharding/dist/comm.h"
#include "sharding/parallel/offload.h"
#include "sharding/parallel/policy.h"

namespace vlm::sharding {

class DdpReducer;
class FsdpEngine;
class FsdpUnit;

// kAuto: at::_fused_adamw_ for the segments whose master and gradient are fp32 on one CPU
// or CUDA device, the blocked foreach ops for the other CPU segments (bf16 / fp16 gradients),
// foreach ops for the rest; kForeach / kFused / kBlocked: that kernel everywhere (tests,
// benchmarks, bitwise comparisons with torch::optim::AdamW; kBlocked needs CPU tensors).
// On CPU the fused kernel is one pass over the state: 41M fp32 parameters on one thread
// 29 ms against ~100 ms for the per-tensor ops (2026-11-25, this machine); it rounds within
// a few fp32 ulps of torch::optim::AdamW per step, where kBlocked / kForeach give its bits.
enum class AdamWKernel { kAuto, kForeach, kFused, kBlocked };

// Checkpoint state, independent of the world size that wrote it. Each unit has a flat
// index space [P] (its parameters in registration order); a piece of state is a vector
// over that space, named "<unit path>/<kind>":
//   master      fp32 master weights (trainable units)
//   exp_avg     AdamW m (fp32)
//   exp_avg_sq  AdamW v (fp32)
//   param       the parameters in param dtype (frozen units, which have no master)
//   step        per-parameter AdamW step counts (int64 [number of the unit's parameters],
//               not [P]; checkpoints written before it existed load with every count =
//               the global optimizer step count)
// Expert rows (ep) are keyed per parameter over all E experts instead, so that they do not
// depend on dist.ep: "<parameter name>/<kind>" (model.layers.1.mlp.experts.down_proj/master)
// of UnitParam::source_numel elements; a rank holds [source_offset, + numel) and writes its
// part of it within the expert-replicate group. "<unit>+experts/step" as above.
// A slice is the owned range R_r = [r*S, min((r+1)*S, P)), S = ceil(P/N), of one vector:
// the N ranks' slices cover each vector exactly once, whatever the unit's sharding.
struct StateSlice {
  std::string key;     // "model.layers.3/exp_avg"
  int64_t numel = 0;   // P
  int64_t lo = 0;      // [lo, hi) inside [0, P)
  int64_t hi = 0;
  torch::Tensor data;  // [hi - lo] on CPU (a copy; pinned when the state is on a GPU)
};
// A checkpoint's state as the optimizer reads it. read(key, lo, hi): elements [lo, hi) of
// the vector `key` (any dtype; the caller converts), from whatever slices the checkpoint
// holds; throws vlm::Error ("no state named ...") when it is not covered. Keys: a unit's
// "<unit>/<kind>" (kind master, exp_avg, exp_avg_sq, param, step) and a parameter's
// "<param>/<kind>" (expert-parallel rows store their parameters so). A reader with `numel`
// says how long a vector is (-1: not held); it must then also serve every parameter's
// "<param>/<kind>" wherever the writer stored it (the step vector at the parameter's index),
// so that a unit split another way by the writer (expert parallelism on or off) loads
// parameter by parameter. Without `numel` the layouts are assumed to be the same.
struct StateReader {
  using Read = std::function<torch::Tensor(const std::string& key, int64_t lo, int64_t hi)>;
  using Numel = std::function<int64_t(const std::string& key)>;
  Read read;
  Numel numel;
  StateReader(Read r, Numel n = nullptr) : read(std::move(r)), numel(std::move(n)) {}  // NOLINT: implicit
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, StateReader> &&
                                              std::is_invocable_r_v<torch::Tensor, F, const std::string&, int64_t, int64_t>>>
  StateReader(F f) : read(std::move(f)) {}  // NOLINT: implicit, from a lambda
  torch::Tensor operator()(const std::string& key, int64_t lo, int64_t hi) const { return read(key, lo, hi); }
};

// R_r of a vector of `numel` elements split over `world` ranks.
std::pair<int64_t, int64_t> owned_range(int64_t numel, int64_t world, int64_t rank);

class ShardedAdamW {
 public:
  // units: the unit table (frozen units are skipped). Parameters must already be equal on
  // every rank (broadcast first). fsdp: the engine holding the units with sharding
  // kFullShard / kShardGradOp (required when there are any). control: the comm for the
  // grad-norm / flag all-reduce (a CPU fp64 tensor); null: `comm`.
  // offload: state in host memory, updated there asynchronously (see the header comment).
  // expert_replicate: the group over which kExpert rows (ep, policy.h) are replicated; their
  // R_r for the norm is taken over it, since the ranks of an EP group hold different
  // experts (null: none; required when there are kExpert rows and the world is > 1). Their
  // AdamW state is ZeRO-1 over it: each replica keeps and updates R_r of the held experts,
  // then an all-gather over the group refreshes the parameters.
  ShardedAdamW(Comm& comm, const std::vector<UnitPlan>& units, const AdamWOptions& opts,
               FsdpEngine* fsdp = nullptr, Comm* control = nullptr, bool offload = false,
               Comm* expert_replicate = nullptr);
  ~ShardedAdamW();  // waits for the host updates still queued
  // The reducer of the replicated / ZeRO-1 units: their gradients (DdpReducer::grad: the
  // fp32 bucket view for low-precision parameters, else the .grad its finish_backward
  // fills) and which of them had a gradient this step come from it; zero_grad() clears it.
  // May be called once per reducer (the experts of ep rows have one of their own).
  void attach_ddp(DdpReducer* ddp);
  // Gradients shared between ranks that hold the same parameter (each rank's gradient a share
  // of it): `sharing` says, per parameter (by HF name), how it is shared over `comm`: 0 not
  // shared, 1 on every rank of comm, k > 1 one of k pieces each on comm's size / k consecutive
  // ranks. reduce_shared_gradients() sums them over the ranks that share them (per comm one
  // all-reduce of all of them, fp32: a k-piece parameter's gradient placed at its piece in k
  // zeroed pieces), once per step: clip_grad_norm() and step() call it, zero_grad() re-arms it;
  // the gradient norm counts each on the first rank sharing it. The ranks of comm must hold the
  // same shared parameters in the same layout. Call before the first step.
  //   tensor parallelism (tensor_parallel.h): the tp group, tensor_parallel_sharing;
  //   pipeline parallelism (pipeline.h): a tied head's embedding over ParallelDims::pp_tie().
  void add_shared_gradients(Comm* comm, const std::function<int64_t(const std::string&)>& sharing,
                            const std::string& what);
  void set_tensor_parallel(Comm* tp, const std::function<int64_t(const std::string&)>& sharing) {
    add_shared_gradients(tp, sharing, "tensor-parallel gradient sum");
  }
  void reduce_shared_gradients(const std::string& ctx = "shared gradient sum");
  // Pipeline parallelism: the control plane's agreement on which parameters had a gradient
  // spans stages holding different parameters; each stage's flags get their own range
  // (collective over the control plane: every rank, once, before the first step).
  void set_pipeline(int64_t stage, int64_t stages);
  void set_kernel(AdamWKernel k) { kernel_ = k; }
  AdamWKernel kernel() const { return kernel_; }

  // Global L2 norm of the gradients before clipping; clips in place when opts.grad_clip > 0.
  // Undefined grads count as zero. One all-reduce on the control comm (none at world 1),
  // which also agrees which parameters had a gradient (see the header comment).
  double clip_grad_norm(const std::string& ctx = "grad norm");
  // One AdamW step with lr = (the parameter's group lr) * lr_scale (schedule factor);
  // parameters without a gradient on every rank are skipped.
  void step(double lr_scale = 1.0, const std::string& ctx = "optimizer step");
  // Drops every trainable gradient (set to undefined), the DDP reducer's accumulated
  // gradients and flags, and zeros the FSDP shard grads.
  void zero_grad();

  int64_t steps() const { return step_; }  // step() calls (the trainer's optimizer_steps)
  // AdamW step count t of every parameter of trainable unit `unit_path` (registration order).
  std::vector<int64_t> param_steps(const std::string& unit_path) const;
  // This rank's slices of every trainable unit's master / exp_avg / exp_avg_sq.
  std::vector<StateSlice> state_slices() const;
  // Restores masters, moments and the step count (bias correction) from `read`, and
  // writes the masters into the parameters (every element of every trainable parameter,
  // including those whose state another rank holds). Local: no collective.
  // A checkpoint without "<unit>/step" (written before per-parameter counts) gives every
  // parameter t = steps.
  void load_state(const StateReader& read, int64_t steps);
  // Elements of optimizer state on this rank (m + v + separate masters; with offload these
  // are in host memory, which also holds one fp32 grad staging element per state element).
  int64_t state_numel() const;
  // Offload: the host update queue (null without offload).
  HostUpdateQueue* offload_queue() const { return queue_.get(); }
  // Offload waits (no-ops without offload): every queued host update; that of FSDP unit `u`
  // (before its gather); those of the replicated / ZeRO-1 units (before a forward).
  void wait() const;
  void wait_unit(const FsdpUnit& u) const;
  void wait_unsharded() const;
  // Whether this rank holds optimizer state for (part of) `param`.
  bool has_state(const torch::Tensor& param) const;

 private:
  struct Segment {
    int64_t param;          // index into Group::params
    int64_t param_offset;   // first element inside the flattened parameter
    int64_t len;
    int64_t flat_offset;    // position in the unit's flat index space
    torch::Tensor target;   // [len] where the parameter's values live: a view of the
                            // parameter, or of the FSDP unit's local shard
    torch::Tensor master;   // [len] fp32 (= target when the parameter is fp32)
    torch::Tensor m, v;     // [len] fp32
    torch::Tensor host_grad;  // [len] fp32 host staging of the gradient (offload only)
  };
  struct Group {  // one trainable unit
    std::string path;
    bool zero1 = false;
    FsdpUnit* fsdp = nullptr;      // FSDP unit (ZeRO-2 / ZeRO-3): state and grads on R_r
    std::vector<UnitParam> params;
    std::vector<int64_t> offsets;  // flat offset of each parameter
    int64_t numel = 0, shard = 0;  // P, S
    int64_t lo = 0, hi = 0;        // owned range R_r (FSDP units: the unit's, fsdp.h)
    int64_t own_lo = 0, own_hi = 0;  // the part of R_r this rank counts in the norm and writes:
                                     // R_r, or under hybrid_shard its replica's share (fsdp.h)
    std::vector<Segment> segments; // parameters ∩ state range ([0,P) or R_r)
    bool experts = false;             // a kExpert row (ep): state keyed per parameter over all E
    int64_t rep_n = 1, rep_r = 0;     // the group its values are replicated over (size, rank)
    std::vector<int64_t> ddp_index;   // per parameter: index in its DDP reducer, or -1
    std::vector<DdpReducer*> ddp_of;  // per parameter: that reducer (null: none)
    std::vector<int64_t> param_steps; // per parameter: AdamW step count t
    std::vector<char> active;         // per parameter: had a gradient on some rank (agreed)
    std::vector<std::vector<int64_t>> shared;  // [shared group][parameter]: its sharing (add_shared_gradients)
    int64_t ticket = 0;               // offload: the queue ticket of its last host update
  };
  // Per-parameter list of one update (the segments that take part, with their scalars).
  struct Batch {
    std::vector<torch::Tensor> master, grad, m, v;  // [len] each, fp32
    std::vector<double> lr, wd, bc1, bc2, t;  // per segment; t: the parameter's step count
  };
  Comm& control() { return control_ != nullptr ? *control_ : comm_; }
  bool local_had_grad(const Group& g, size_t k) const;
  // Parameter k's gradient, param-shaped, or undefined: the DDP reducer's (ddp.h) for its
  // parameters, else the .grad. Every read of a replicated / ZeRO-1 gradient goes here.
  torch::Tensor param_grad(const Group& g, size_t k) const;
  torch::Tensor segment_grad(const Group& g, const Segment& s) const;  // [len] fp32
  std::vector<torch::Tensor> norm_parts() const;  // this rank's gradient segments, R_r
  // All-reduces [local_sumsq, flags...] (fp64 CPU) and sets Group::active; returns the sum.
  double agree(double local_sumsq, const std::string& ctx);
  // Appends segment s (its gradient `grad`, [len] fp32) to b with its scalars at this step.
  void add_segment(Batch& b, const Group& g, const Segment& s, torch::Tensor grad, double lr_scale) const;
  void update_foreach(Batch& b);
  void update_blocked(Batch& b);  // CPU
  void update_fused(Batch& b);
  void update_host(Batch& b);  // offload: fused where every segment fits it, else blocked
  static bool fused_fits(const torch::Tensor& master, const torch::Tensor& grad);
  // ZeRO-1 (and expert rows over their replicas): every rank's updated slice -> every
  // rank's parameters, over `comm` (the world, or the expert-replicate group).
  void zero1_gather(Group& g, Comm& comm, const std::string& ctx);
  // The comm a group's ZeRO-1 gather runs on; null when its state is not sharded that way.
  Comm* gather_comm(const Group& g);
  void expert_slices(const Group& g, const torch::TensorOptions& host, bool async, std::vector<StateSlice>& out) const;
  void load_experts(Group& g, const StateReader& read);
  void step_offload(double lr_scale, const std::string& ctx);

  Comm& comm_;
  Comm* control_ = nullptr;
  Comm* expert_replicate_ = nullptr;
  struct SharedComm {
    Comm* comm = nullptr;
    std::string what;  // for errors: "tensor-parallel gradient sum"
  };
  std::vector<SharedComm> shared_;  // add_shared_gradients, in order
  bool shared_reduced_ = false;     // this step's shared gradients summed
  void reduce_shared(size_t i, const std::string& ctx);
  bool counted_in_norm(const Group& g, size_t k) const;  // false: another rank sharing it counts it
  int64_t pp_stage_ = 0, pp_stages_ = 1, flags_max_ = 0;  // set_pipeline
  std::vector<DdpReducer*> ddps_;  // attached reducers (zero_grad clears them)
  AdamWOptions opts_;
  FsdpEngine* fsdp_ = nullptr;
  AdamWKernel kernel_ = AdamWKernel::kAuto;
  std::vector<Group> groups_;
  int64_t step_ = 0;
  bool agreed_ = false;  // Group::active holds this step's agreement
  std::unique_ptr<HostUpdateQueue> queue_;  // offload only
  int64_t unsharded_ticket_ = 0;  // offload: last ticket of a replicated / ZeRO-1 unit
};

}  // namespace vlm::sharding
