#include "vlm/model/decoder_layer.h"

#include "vlm/model/recompute_tail.h"
#include "vlm/runtime/check.h"
#include "vlm/model/tensor_parallel.h"

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
                                        SequenceExchange* sp, SequenceExchange* tp, bool tp_sequence) {
  if (tp != nullptr && tp->size() > 1) {
    VLM_CHECK(sp == nullptr && aux == nullptr,
              "tensor parallelism: not with context parallelism or a load-balancing loss yet");
    return forward_tp(x, cos, sin, mask, padding, cache, cu_seqlens, *tp, tp_sequence);
  }
  const auto n = input_layernorm(x);
  auto h = x + (linear_attn ? linear_attn(n, padding, cache ? &cache->linear : nullptr, cu_seqlens, sp)
                            : self_attn(n, cos, sin, mask, cache ? &cache->kv : nullptr, cu_seqlens, sp));
  if (moe) return h + moe(post_attention_layernorm(h), aux);
  return residual_linear(this, h, mlp->hidden(post_attention_layernorm(h)), mlp->out_proj());
}

// Sequence mode: gather the chunks before the mixer and the MLP (every token, this rank's
// heads / channels), reduce-scatter their partial outputs back to the chunk. A sparse
// layer's experts run on the chunk. Whole mode: the partial outputs are all-reduced.
torch::Tensor DecoderLayerImpl::forward_tp(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                           const torch::Tensor& mask, const torch::Tensor& padding, LayerCache* cache,
                                           const std::vector<int64_t>* cu, SequenceExchange& tp, bool sequence) {
  auto gather = [&](const torch::Tensor& t, const char* what) { return sequence ? tp_all_gather(tp, t, 1, what) : t; };
  auto reduce = [&](const torch::Tensor& t, const char* what) {
    return sequence ? tp_reduce_scatter(tp, t, 1, what) : tp_all_reduce(tp, t, what);
  };
  const auto n = gather(input_layernorm(x), "tensor parallel: the mixer's input");  // [B, L, d]
  auto m = linear_attn ? linear_attn(n, padding, cache ? &cache->linear : nullptr, cu, nullptr)
                       : self_attn(n, cos, sin, mask, cache ? &cache->kv : nullptr, cu, nullptr);
  auto h = x + reduce(m, "tensor parallel: the mixer's output");
  if (moe) return h + moe(post_attention_layernorm(h), nullptr);
  return h + reduce(mlp(gather(post_attention_layernorm(h), "tensor parallel: the MLP's input")),
                    "tensor parallel: the MLP's output");
}

}  // namespace vlm
