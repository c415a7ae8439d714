// `model.layers.N`: pre-norm Qwen2 decoder layer.
//   h = x + o_proj(attn(input_layernorm(x))); out = h + mlp(post_attention_layernorm(h))
#pragma once
#include <torch/torch.h>

#include "vlm/model/attention.h"
#include "vlm/model/config.h"
#include "vlm/model/layers.h"
#include "vlm/model/mlp.h"

namespace vlm {

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const TextConfig& cfg, const torch::TensorOptions& opts);
  // x: [B, L, d]; cos/sin: [B, L, D]; mask: bool [B, 1, L, T]; cache: optional;
  // cu_seqlens: optional packed-row segments (TextAttentionImpl::forward) -> [B, L, d]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask, LayerKv* cache = nullptr,
                        const std::vector<int64_t>* cu_seqlens = nullptr);
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  TextAttention self_attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

}  // namespace vlm
