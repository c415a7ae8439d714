// Recompute tails: the last matmul of a checkpointed block is not run again in backward.
//
// An activation-checkpointed unit (sharding/parallel/activation_checkpoint.h) runs its forward a
// second time during backward only to rebuild the graph, then differentiates its output y
// with the incoming gradient g. The value of y is never read. Every block here ends in
//
//   y = h + out_proj(m)          (decoder layer: m = silu(gate n) * up n, out_proj = down_proj;
//                                 vision blocks: fc2 / linear_fc2 / down_proj)
//
// and the backward of that last step needs only m, out_proj's weight and g:
//   dh = g,  dm = g W,  dW = g^T m,  db = sum g
// so the recompute can stop at m, as torch.utils.checkpoint's early stop does (it skips
// the recomputation of whatever no saved tensor depends on). For the decoder layer this is
// one of its seven matmuls and about a fifth of its FLOPs.
//
//   RecomputeTail tail(unit);                            // set by the checkpoint's recompute
//   return residual_linear(this, h, mlp->hidden(n), mlp->out_proj());  // in the block
//
// residual_linear returns h + out_proj(m) unless a RecomputeTail for this very block is
// active on the thread; then it returns a tensor with the same graph (same gradients for h,
// m, W, b and a LoRA adapter's A and B) whose VALUE IS h, not y. A block must therefore use
// it only as its returned output. The guard names the block so that nested modules (a
// block's own submodules) never take the shortcut.
#pragma once
#include <torch/torch.h>

#include "vlm/model/layers.h"

namespace vlm {

// Marks `unit`'s forward, on this thread and while alive, as a recompute whose output value
// is not used. Nestable (restores the previous unit).
class RecomputeTail {
 public:
  explicit RecomputeTail(const torch::nn::Module* unit);
  ~RecomputeTail();
  RecomputeTail(const RecomputeTail&) = delete;
  RecomputeTail& operator=(const RecomputeTail&) = delete;

 private:
  const torch::nn::Module* previous_;
};

// h: [..., out] the residual; m: [..., in] out_proj's input.
// -> h + out_proj(m), or (inside RecomputeTail(block)) a tensor with its gradients and h's value.
torch::Tensor residual_linear(const torch::nn::Module* block, const torch::Tensor& h,
                              const torch::Tensor& m, LinearImpl& out_proj);

// Number of last matmuls skipped so far in this process (tests).
int64_t recompute_tails_skipped();

}  // namespace vlm
