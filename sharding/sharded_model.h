// apply_policies: the one entry point that turns a built model into a sharded one.
//
//   auto sm = vlm::sharding::apply_policies(*model, opts, dims);   // collective: all ranks
//   int64_t tokens = global_token_count(dims.comm(), local_tokens);  // once per step
//   for (micro-batch k of K) {
//     sm->set_sync(k == K - 1);                       // no_sync during accumulation
//     auto out = model->forward(batch_k);
//     (out.loss_sum / tokens).backward();
//     sm->finish_backward(ctx);                       // waits the bucket all-reduces
//   }
//   double norm = sm->optimizer().clip_grad_norm();
//   sm->optimizer().step(lr_scale);  sm->optimizer().zero_grad();
//
// Order in which the techniques are applied (each step a free function below):
//   1. resolve_units      policy table + optimizer groups -> unit table (policy.h)
//   2. apply_freeze       frozen units: requires_grad = false (no grads, no state, no traffic)
//   3. broadcast          every parameter from rank 0 (frozen ones included)
//   4. DdpReducer         gradient buckets over the trainable replicated / ZeRO-1 units
//   5. runner             installed on the model: frozen units whose input needs no grad run
//                         under NoGradGuard (so the frozen vision tower builds no graph)
//   6. ShardedAdamW       fp32 masters (ZeRO-1 units: sharded state)
// FSDP units (issue #8) have no runtime yet: they run as ddp no_shard (replicated) and
// notes() says so; the memory plan still shows their FSDP layout. Activation
// checkpointing is planned (flag in the unit table) but has no runtime yet (a note too).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "sharding/ddp.h"
#include "sharding/optimizer.h"
#include "sharding/parallel_dims.h"
#include "sharding/policy.h"
#include "vlm/qwen2_vl.h"

namespace vlm::sharding {

// Step 2: requires_grad = false on every parameter of the frozen units.
void apply_freeze(const std::vector<UnitPlan>& units);

// Step 5: runs frozen units under NoGradGuard when their input needs no gradient.
class PolicyRunner : public vlm::UnitRunner {
 public:
  explicit PolicyRunner(const std::vector<UnitPlan>& units);
  torch::Tensor run(const std::string& path, torch::nn::Module& unit, const torch::Tensor& x,
                    const std::function<torch::Tensor(const torch::Tensor&)>& fn) override;
  int64_t no_grad_calls() const { return no_grad_calls_; }  // frozen unit calls without graph

 private:
  std::vector<std::string> frozen_;  // paths and aliases of frozen units
  int64_t no_grad_calls_ = 0;
};

class ShardedModel {
 public:
  const std::vector<UnitPlan>& unit_table() const { return units_; }
  std::shared_ptr<PolicyRunner> runner() const { return runner_; }
  ShardedAdamW& optimizer() { return *optimizer_; }
  DdpReducer* reducer() { return reducer_.get(); }  // null when nothing is trainable
  // false during gradient-accumulation micro-batches (no_sync), true on the last one.
  void set_sync(bool sync);
  // Waits the gradient reduction of a synced micro-batch; a no-op under no_sync.
  void finish_backward(const std::string& ctx = "backward");
  // Checkpoint state of this rank (optimizer.h StateSlice): the optimizer's slices plus
  // "<unit>/param" slices of the frozen units. Local: no collective.
  std::vector<StateSlice> state_slices() const;
  // Restores what state_slices() saved (written by any world size). Local: no collective.
  void load_state(const StateReader& read, int64_t optimizer_steps);
  // Human-readable notes on what runs differently from the plan (fsdp as ddp, ...).
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  friend std::unique_ptr<ShardedModel> apply_policies(vlm::Qwen2VLImpl&, const ShardingOptions&, ParallelDims&);
  ShardedModel() = default;
  std::vector<UnitPlan> units_;
  std::shared_ptr<PolicyRunner> runner_;
  std::unique_ptr<DdpReducer> reducer_;
  std::unique_ptr<ShardedAdamW> optimizer_;
  std::vector<std::string> notes_;
  int64_t rank_ = 0, world_ = 1;
};

// Collective (every rank calls it with the same options). The model must already hold
// its parameters (materialised or loaded) on dims.device(), in opts.param_dtype (checked).
std::unique_ptr<ShardedModel> apply_policies(vlm::Qwen2VLImpl& model, const ShardingOptions& opts,
                                             ParallelDims& dims);

}  // namespace vlm::sharding
