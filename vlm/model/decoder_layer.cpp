#include "vlm/model/decoder_layer.h"

#include "vlm/model/recompute_tail.h"

namespace vlm {

DecoderLayerImpl::DecoderLayerImpl(const TextConfig& cfg, const torch::TensorOptions& opts) {
  input_layernorm = register_module("input_layernorm",
                                    Norm(NormKind::rms_norm, cfg.hidden_size, cfg.rms_norm_eps, opts));
  self_attn = register_module("self_attn", TextAttention(cfg, opts));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", Norm(NormKind::rms_norm, cfg.hidden_size, cfg.rms_norm_eps, opts));
  mlp = register_module("mlp", Mlp(MlpKind::gated_silu, cfg.hidden_size, cfg.intermediate_size,
                                   /*bias=*/false, opts));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                        const torch::Tensor& sin, const torch::Tensor& mask,
                                        LayerKv* cache, const std::vector<int64_t>* cu_seqlens) {
  auto h = x + self_attn(input_layernorm(x), cos, sin, mask, cache, cu_seqlens);
  return residual_linear(this, h, mlp->hidden(post_attention_layernorm(h)), mlp->out_proj());
}

}  // namespace vlm
