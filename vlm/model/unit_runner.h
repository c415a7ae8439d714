// The seam between the model and sharding/: the model calls every unit (embedding, each
// vision block, merger, each decoder layer, final norm, head) through a UnitRunner, in a
// fixed order. sharding/ implements runners that gather/free FSDP parameters or apply
// activation checkpointing around fn; the default runner just calls fn.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <string>

namespace vlm {

class UnitRunner {  // implemented by sharding/ (FSDP gather/free, activation checkpointing)
 public:
  virtual ~UnitRunner() = default;
  // Runs one unit: path is the module path ("visual.patch_embed", "visual.blocks.3",
  // "visual.merger", "model.embed_tokens", "model.layers.0", "model.norm", "lm_head");
  // fn computes the unit's forward on x. Non-differentiable side inputs (cos/sin, masks,
  // cu_seqlens) are captured by fn; the differentiable activation is x.
  // Note "model.embed_tokens" receives the int64 input_ids as x (no gradient flows into x).
  // fn holds copies of everything it captures (tensor handles, module holders, cu_seqlens),
  // so a runner may keep it and call it again later, e.g. to recompute the unit during
  // backward (activation checkpointing). Exception: decoding with a KV cache appends to the
  // cache on every call, so cached generation must not be recomputed (it runs under
  // NoGradGuard, where checkpointing has nothing to do).
  virtual torch::Tensor run(const std::string& path, torch::nn::Module& unit, const torch::Tensor& x,
                            const std::function<torch::Tensor(const torch::Tensor&)>& fn) {
    return fn(x);
  }
};

// One entry of the model's ordered unit table (see VisionLanguageModelImpl::units()).
struct Unit {
  std::string path;            // e.g. "model.layers.0"
  torch::nn::Module* module;   // owned by the model
  // Non-empty when the unit computes with another unit's parameters instead of owning any:
  // a tied "lm_head" uses "model.embed_tokens" (its module is that Embedding).
  std::string shares_params_with;
  // Whether this call's backward reads the parameters. An embedding's backward only
  // scatters its gradient by the ids (never reads the table), so FSDP need not gather
  // model.embed_tokens for it (sharding/parallel/fsdp.h skip_backward_gather).
  bool backward_reads_params = true;
};

}  // namespace vlm
