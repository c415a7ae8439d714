// `visual.merger`: norm each ViT token (`ln_q`), concatenate the merge x merge tokens of
// each block (consecutive rows in merge-block order), then Linear -> exact GELU -> Linear
// (`mlp.0`, `mlp.2`) to the LLM width.
#pragma once
#include <torch/torch.h>

#include "vlm/model/config.h"
#include "vlm/model/layers.h"

namespace vlm {

// `visual.merger.mlp`: children named "0" and "2" as in HF's nn.Sequential (1 is the GELU).
class MergerMlpImpl : public torch::nn::Module {
 public:
  MergerMlpImpl(int64_t in, int64_t out, const torch::TensorOptions& opts);
  // x: [N, in] -> [N, out]
  torch::Tensor forward(const torch::Tensor& x);
  Linear fc0{nullptr}, fc2{nullptr};
};
TORCH_MODULE(MergerMlp);

class PatchMergerImpl : public torch::nn::Module {
 public:
  // ln_q: cfg.vision.norm (LayerNorm with bias, or RMSNorm), eps from cfg.vision.
  PatchMergerImpl(const VlmConfig& cfg, const torch::TensorOptions& opts);
  // x: [S, embed_dim] (S divisible by merge^2) -> [S / merge^2, out_hidden_size]
  torch::Tensor forward(const torch::Tensor& x);
  int64_t merged_dim;  // embed_dim * merge^2
  Norm ln_q{nullptr};
  MergerMlp mlp{nullptr};
};
TORCH_MODULE(PatchMerger);

}  // namespace vlm
