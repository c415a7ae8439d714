// Activation checkpointing: run a unit's forward without keeping its activations and
// recompute them during backward.
//
//   y = checkpoint_unit(x, params, fn, before_recompute);  // y = fn(x), no graph inside fn kept
//
// A custom autograd function (CheckpointFunction) with inputs (x, params...) whose forward
// calls fn(x) with autograd off, saving only x (and the RNG state), and whose backward
//   1. calls before_recompute() (the FSDP re-gather of the unit's parameters),
//   2. restores the RNG state of the forward (CPU generator, plus the device generator
//      when x is on an accelerator) so dropout-like ops draw the same numbers,
//   3. recomputes y' = fn(x') with autograd on, x' = x detached (requires_grad as x),
//   4. computes d(y')/d(x', params) . grad_y with torch::autograd::grad and returns those
//      as the gradients of its inputs.
// The parameters' gradients thus reach their AccumulateGrad nodes through the outer
// backward, summed with any other use of the same parameters (a tied lm_head), so DDP /
// FSDP gradient-ready hooks fire once per backward as without checkpointing. Passing the
// trainable parameters as inputs also makes the output require grad when x does not
// (model.embed_tokens gets input_ids; the first trainable unit after a frozen tower).
//
// Memory: per checkpointed unit only x (and y, kept by the next unit) live between
// forward and backward; the unit's internals exist once, during its recompute.
// Gradients equal a plain run's up to floating-point reassociation (tests: 1e-6).
#pragma once
#include <torch/torch.h>

#include <functional>

namespace vlm::sharding {

// x: the unit's input (any dtype); params: the unit's parameters (those not requiring grad
// are ignored); fn: the unit's forward; before_recompute may be empty; recompute, when
// given, replaces fn in step 3: a forward with the same graph whose output value may differ
// (ShardedModel passes fn under vlm::RecomputeTail, vlm/model/recompute_tail.h, which skips the
// unit's last matmul). Under NoGradGuard, or when neither x nor a parameter requires grad,
// the call is just fn(x).
torch::Tensor checkpoint_unit(const torch::Tensor& x, const std::vector<torch::Tensor>& params,
                              std::function<torch::Tensor(const torch::Tensor&)> fn,
                              std::function<void()> before_recompute,
                              std::function<torch::Tensor(const torch::Tensor&)> recompute = {});

// Number of recomputations run so far in this process (tests).
int64_t checkpoint_recomputes();

}  // namespace vlm::sharding
