// `model.layers.N`: pre-norm decoder layer with the token mixer TextConfig::mixer(N) picks:
//   h = x + mixer(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h))
// where mixer is `self_attn` (softmax attention: Qwen2, Qwen3, Qwen3.5's full layers) or
// `linear_attn` (Gated DeltaNet: Qwen3.5's linear layers), and mlp is the dense SwiGLU or, in
// a sparse layer (TextConfig::sparse_layer), the mixture of experts (moe.h).
#pragma once
#include <torch/torch.h>

#include "vlm/model/attention.h"
#include "vlm/model/config.h"
#include "vlm/model/gated_delta_net.h"
#include "vlm/model/layers.h"
#include "vlm/model/mlp.h"
#include "vlm/model/moe.h"

namespace vlm {

// What one decoder layer keeps for cached decoding: keys / values (attention layers) or the
// conv and recurrent state (linear-attention layers).
struct LayerCache {
  LayerKv kv;
  LinearAttentionState linear;
};

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const TextConfig& cfg, int64_t layer_index, const torch::TensorOptions& opts);
  // x: [B, L, d]; cos/sin: [B, L, R]; mask: bool [B, 1, L, T] (attention; ring sequence
  // parallelism: the key padding [B, cp x L]) and padding: [B, L]
  // (the new tokens' attention_mask, linear attention), either undefined; cache: optional;
  // cu_seqlens: optional packed-row segments (TextAttentionImpl::forward); aux: the forward's
  // load-balancing state (sparse layers; null = none); sp: the sequence split over a
  // context-parallel group (sequence_parallel.h; null = none) -> [B, L, d]
  // tp: the tensor-parallel group (tensor_parallel.h; the layer was built with its local
  // heads and MLP width). tp_sequence: x is this rank's chunk [B, L / tp, d] of the sequence
  // (cos, sin, mask, padding and cu_seqlens the whole padded sequence's) and the result too
  // (Megatron's sequence parallelism); else x is the whole sequence and the mixer and MLP
  // outputs are all-reduced (evaluation, generation).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask, const torch::Tensor& padding, LayerCache* cache = nullptr,
                        const std::vector<int64_t>* cu_seqlens = nullptr, RouterAuxState* aux = nullptr,
                        SequenceExchange* sp = nullptr, SequenceExchange* tp = nullptr, bool tp_sequence = true);
  MixerKind mixer;
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  TextAttention self_attn{nullptr};     // full_attention layers
  GatedDeltaNet linear_attn{nullptr};   // linear_attention layers
  Mlp mlp{nullptr};              // dense layers
  SparseMoeBlock moe{nullptr};   // sparse layers (registered as "mlp")

 private:
  torch::Tensor forward_tp(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                           const torch::Tensor& mask, const torch::Tensor& padding, LayerCache* cache,
                           const std::vector<int64_t>* cu_seqlens, SequenceExchange& tp, bool sequence);
};
TORCH_MODULE(DecoderLayer);

}  // namespace vlm
