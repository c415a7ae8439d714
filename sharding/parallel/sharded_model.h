// apply_policies: the one entry point that turns a built model into a sharded one.
//
//   auto sm = vlm::sharding::apply_policies(*model, opts, dims);   // collective: all ranks
//   int64_t tokens = global_token_count(dims.comm(), local_tokens);  // once per step
//   for (micro-batch k of K) {
//     sm->set_sync(k == K - 1);                       // no_sync during accumulation
//     auto out = model->forward(batch_k);
//     (out.loss_sum / tokens).backward();
//     sm->finish_backward(ctx);                       // waits the gradient reductions
//   }
//   double norm = sm->optimizer().clip_grad_norm();   // NaN/inf when any gradient is
//   sm->optimizer().step(lr_scale);  sm->optimizer().zero_grad();  // zero_grad: DDP buckets, FSDP shards too
//   MemoryReport mem = sm->memory();                  // bytes per rank (metrics, plan)
//
// Order in which the techniques are applied (each step a free function below):
//   0. attach_lora        adapters on the Linear modules of the lora rules (lora.h)
//   0b. apply_expert_parallel  with ep rules (policy.h): every sparse layer keeps its
//                         E / dist.ep experts and gets the all-to-all dispatcher
//                         (expert_parallel.h); dims.ep() must be > 1. With a ParamSource
//                         the held experts are read here (step 1b skips them)
//   0c. apply_context_parallel  dims.cp() > 1: the model's sequence exchange over the cp
//                         group in opts.cp_mode (context_parallel.h); the engines below
//                         count cp ranks as data-parallel replicas
//   1. resolve_units      policy table + optimizer groups -> unit table (policy.h)
//   1b. materialize_units with a ParamSource (model built on meta): each rank allocates and
//                         reads only what it keeps (sharded_load.h)
//   2. apply_freeze       frozen units: requires_grad = false (no grads, no state, no traffic)
//   3. broadcast          every parameter from rank 0 (frozen ones included); skipped with a
//                         ParamSource (every rank read the same values)
//   4. FsdpEngine         fsdp full_shard / shard_grad_op units and frozen full_shard units:
//                         flat parameters, 1/N shard per rank (fsdp.h)
//   5. DdpReducer         gradient buckets over the trainable replicated / ZeRO-1 units
//                         (ddp, ddp shard_optimizer, fsdp no_shard); a second one over the
//                         `+experts` rows on the expert-replicate group (its own comm), whose
//                         step-3 broadcast also runs there, not over the world
//   6. runner             installed on the model, per unit call: FSDP gather (+ prefetch of
//                         the next unit); frozen units whose input needs no grad run under
//                         NoGradGuard (the frozen vision tower builds no graph); activation
//                         checkpointing of the units opts.checkpoint_match names
//                         (activation_checkpoint.h, recompute after the FSDP re-gather); FSDP
//                         free / pre-backward hook.
//   7. ShardedAdamW       fp32 masters; ZeRO-1 and FSDP units: state for R_r only; with
//                         opts.optimizer_offload in host memory, updated there while the
//                         next forward runs (offload.h: the runner's and the FSDP engine's
//                         before-call / before-gather hooks wait for the updates they need)
//
// Gradient accumulation: set_sync(false) keeps DDP gradients local (no_sync; in fp32 in the
// bucket buffers when the params are bf16 and reduce_dtype fp32, ddp.h); FSDP units
// reduce-scatter every micro-batch into their fp32 shard grad (accumulated there), or, with
// opts.fsdp_accumulate_unsharded, keep an unsharded sum until the synced micro-batch
// (fsdp.h). finish_backward() must be called after every micro-batch's backward. Every rank must run
// the same units, forward and backward, in every micro-batch (the dummy image does that
// for text-only batches): FSDP re-gathers in backward are collectives.
// Mixed precision: the model is built in opts.param_dtype (compute dtype; FSDP flat buffers
// and gathers in it); gradients are reduced in opts.reduce_dtype; masters are fp32.
// The model's FSDP parameters are views of buffers the ShardedModel owns: use the model
// only while its ShardedModel lives.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "sharding/parallel/ddp.h"
#include "sharding/parallel/expert_parallel.h"
#include "sharding/parallel/optimizer.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/policy.h"
#include "sharding/parallel/sharded_load.h"
#include "vlm/io/param_source.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::sharding {

// Step 2: requires_grad = false on every parameter of the frozen units.
void apply_freeze(const std::vector<UnitPlan>& units);

// The model's calls whose backward does not read their unit's parameters
// (Unit::backward_reads_params false: model.embed_tokens), unless their unit is checkpointed
// (the recompute reads them): FSDP does not gather them for backward (fsdp.h), and the
// traffic plan counts no backward all-gather for them (app/plan/traffic_plan.h).
std::set<std::string> calls_without_backward_gather(vlm::VisionLanguageModelImpl& model,
                                                    const std::vector<UnitPlan>& units);

class FsdpEngine;

// Step 6: the runner (see above). fsdp may be null (no FSDP unit).
class PolicyRunner : public vlm::UnitRunner {
 public:
  explicit PolicyRunner(const std::vector<UnitPlan>& units, FsdpEngine* fsdp = nullptr);
  torch::Tensor run(const std::string& path, torch::nn::Module& unit, const torch::Tensor& x,
                    const std::function<torch::Tensor(const torch::Tensor&)>& fn) override;
  int64_t no_grad_calls() const { return no_grad_calls_; }  // frozen unit calls without graph
  int64_t checkpointed_calls() const { return checkpointed_calls_; }  // calls run under checkpointing
  void detach_fsdp() { fsdp_ = nullptr; }
  // Called at the top of every unit call (optimizer offload: waits for the replicated /
  // ZeRO-1 units' host updates, offload.h); empty: nothing.
  void set_before_call(std::function<void()> f) { before_call_ = std::move(f); }

 private:
  std::vector<std::string> frozen_;        // paths and aliases of frozen units
  std::vector<std::string> checkpointed_;  // paths and aliases of checkpointed units
  FsdpEngine* fsdp_ = nullptr;
  std::function<void()> before_call_;
  int64_t no_grad_calls_ = 0;
  int64_t checkpointed_calls_ = 0;
};

// Bytes per rank, measured from the tensors this rank holds (cf. the plan: memory_plan.h).
struct MemoryReport {
  double param_bytes = 0;   // persistent parameters: whole for replicated / ZeRO-1 / frozen
                            // units, the [S] local shard for FSDP units
  double grad_bytes = 0;    // gradients: per trainable replicated / ZeRO-1 unit its .grad
                            // (P x param dtype) and its DDP bucket buffers (P x reduce
                            // dtype); [S] fp32 shard grads of FSDP units
  double optim_bytes = 0;   // AdamW m + v and the separate fp32 masters (0 with offload)
  double persistent() const { return param_bytes + grad_bytes + optim_bytes; }
  double host_optim_bytes = 0;  // optimizer offload: fp32 masters, m, v and grad staging in
                                // host memory (pinned on CUDA); not part of persistent()
  double gathered_bytes = 0;       // FSDP flat buffers gathered now (transient)
  double gathered_peak_bytes = 0;  // their peak since apply_policies / reset_gather_peak()
  int64_t gathered_peak_units = 0; // most units gathered at once since then
  double reduce_scatter_peak_bytes = 0;  // FSDP reduce-scatter buffers in flight, peak since then
  double unsharded_accum_peak_bytes = 0; // FSDP unsharded accumulators (fsdp.h), peak since then
};

class ShardedModel {
 public:
  const std::vector<UnitPlan>& unit_table() const { return units_; }
  // Every stage's rows (pipeline parallelism: unit_table() holds this stage's only; the
  // others' parameters are meta tensors, whose names and shapes this still gives): what a
  // checkpoint's unit layout and the ranks' fingerprint describe. unit_table() without pp.
  const std::vector<UnitPlan>& layout_table() const { return layout_units_.empty() ? units_ : layout_units_; }
  const vlm::PipelineStage& pipeline_stage() const { return stage_; }
  std::shared_ptr<PolicyRunner> runner() const { return runner_; }
  ShardedAdamW& optimizer() { return *optimizer_; }
  DdpReducer* reducer() { return reducer_.get(); }  // null when nothing is trainable
  // The `+experts` rows' reducer (expert-replicate group) and dispatcher; null without ep.
  DdpReducer* expert_reducer() { return expert_reducer_.get(); }
  ExpertParallelDispatcher* dispatcher() { return dispatcher_.get(); }
  // false during gradient-accumulation micro-batches (no_sync), true on the last one.
  void set_sync(bool sync);
  // Waits the gradient reduction of a synced micro-batch; a no-op under no_sync.
  void finish_backward(const std::string& ctx = "backward");
  // Checkpoint state of this rank (optimizer.h StateSlice): the optimizer's slices plus
  // "<unit>/param" slices of the frozen units, except with LoRA (stores_frozen() false):
  // then only trainable state, and the frozen base comes from the model source on resume.
  // Pipeline parallelism: each stage's units; a tied embedding held by stage 0 and the last
  // stage is written by stage 0 only (the keys are then unique, as at any world size).
  // Local: no collective.
  std::vector<StateSlice> state_slices() const;
  // Restores what state_slices() saved (written by any world size). Local: no collective.
  // Tensor parallelism (tp() > 1): the keys of both are "tp<r>of<n>/<key>", each tp rank's
  // slices of its own vectors. A checkpoint of the same tp loads them (any data-parallel
  // size); one of another tp (tp 1 included) loads parameter by parameter, each parameter's
  // whole state (StateReader "<param>/<kind>"; app/train/checkpoint.h puts a tensor-parallel
  // checkpoint's slices back together) cut to this rank's slice.
  void load_state(const StateReader& read, int64_t optimizer_steps);
  int64_t tp() const { return tp_; }
  // Whether checkpoints hold the frozen units' parameters (false when any unit has LoRA
  // adapters: a LoRA checkpoint holds the adapters, the units trained in full and their
  // optimizer state only).
  bool stores_frozen() const { return stores_frozen_; }
  // Human-readable notes on what runs differently from the plan.
  const std::vector<std::string>& notes() const { return notes_; }
  // Memory on this rank (local, no collective).
  MemoryReport memory() const;
  void reset_gather_peak();
  FsdpEngine* fsdp() { return fsdp_.get(); }  // null when no unit is FSDP-sharded
  ~ShardedModel();
  // What sharded loading did on this rank (zeros when the model came materialised).
  const ShardedLoadStats& load_stats() const { return load_stats_; }

 private:
  friend std::unique_ptr<ShardedModel> apply_policies(vlm::VisionLanguageModelImpl&, const ShardingOptions&, ParallelDims&,
                                                      vlm::ParamSource*);
  ShardedModel() = default;
  std::vector<UnitPlan> units_;
  std::vector<UnitPlan> layout_units_;  // pipeline parallelism: every stage's rows (empty: units_)
  vlm::PipelineStage stage_;
  std::shared_ptr<PolicyRunner> runner_;
  std::unique_ptr<FsdpEngine> fsdp_;  // before optimizer_: the optimizer points into it
  std::unique_ptr<DdpReducer> reducer_;
  std::unique_ptr<DdpReducer> expert_reducer_;
  std::shared_ptr<ExpertParallelDispatcher> dispatcher_;
  std::unique_ptr<ShardedAdamW> optimizer_;
  std::vector<std::string> notes_;
  int64_t rank_ = 0, world_ = 1;
  int64_t tp_ = 1, tp_rank_ = 0;  // tensor parallelism: the state keys' "tp<r>of<n>/" prefix
  vlm::VlmConfig cfg_;            // the model's (tensor parallelism: the splits)
  StateReader tensor_parallel_reader(const StateReader& reader) const;
  bool stores_frozen_ = true;
  ShardedLoadStats load_stats_;
};

// Collective (every rank calls it with the same options). Without a source, the model must
// already hold its parameters (materialised or loaded) on dims.device(), in
// opts.param_dtype (checked), and rank 0's values are broadcast. With a source, the model
// is built on the meta device (in opts.param_dtype) and every rank materialises only what
// it keeps from the source (step 1b); the source must outlive this call only.
std::unique_ptr<ShardedModel> apply_policies(vlm::VisionLanguageModelImpl& model, const ShardingOptions& opts,
                                             ParallelDims& dims, vlm::ParamSource* source = nullptr);

}  // namespace vlm::sharding
