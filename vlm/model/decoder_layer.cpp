#include "vlm/model/decoder_layer.h"

#include "vlm/model/recompute_tail.h"

namespace vlm {

DecoderLayerImpl::DecoderLayerImpl(const TextConfig& cfg, int64_t layer_index, const torch::TensorOptions& opts)
    : mixer(cfg.mixer(layer_index)) {
  input_layernorm = register_module("input_layernorm", Norm(cfg.norm, cfg.hidden_size, cfg.rms_norm_eps, opts));
  if (mixer == MixerKind::linear_attention)
    linear_attn = register_module("linear_attn", GatedDeltaNet(cfg, opts));
  else
    self_attn = register_module("self_attn", TextAttention(cfg, opts));
  post_attention_layernorm =
      register_module("post_attention_layernorm", Norm(cfg.norm, cfg.hidden_size, cfg.rms_norm_eps, opts));
  if (cfg.sparse_layer(layer_index))
    moe = register_module("mlp", SparseMoeBlock(cfg, opts));
  else
    mlp = register_module("mlp", Mlp(MlpKind::gated_silu, cfg.hidden_size, cfg.intermediate_size,
                                     /*bias=*/false, opts));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                        const torch::Tensor& sin, const torch::Tensor& mask,
                                        const torch::Tensor& padding, LayerCache* cache,
                                        const std::vector<int64_t>* cu_seqlens, RouterAuxState* aux,
                                        SequenceExchange* sp) {
  const auto n = input_layernorm(x);
  auto h = x + (linear_attn ? linear_attn(n, padding, cache ? &cache->linear : nullptr, cu_seqlens, sp)
                            : self_attn(n, cos, sin, mask, cache ? &cache->kv : nullptr, cu_seqlens, sp));
  if (moe) return h + moe(post_attention_layernorm(h), aux);
  return residual_linear(this, h, mlp->hidden(post_attention_layernorm(h)), mlp->out_proj());
}

}  // namespace vlm
