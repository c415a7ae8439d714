// Attention: the one scaled-dot-product function every attention in the model goes through,
// variable-length (packed) attention for the vision tower, and the two attention modules
// (`visual.blocks.N.attn` and `model.layers.N.self_attn`).
//
// Names: S packed vision tokens, H heads, Hkv kv heads, D head_dim, B batch, L query length,
// T key length (cache + L).
#pragma once
#include <torch/torch.h>

#include <vector>

#include "vlm/model/config.h"
#include "vlm/model/layers.h"
#include "vlm/model/sequence_parallel.h"

namespace vlm {

// softmax(q k^T * scale + mask) v with GQA (query head j uses kv head j / (H / Hkv)).
// q: [B, H, L, D], k/v: [B, Hkv, T, D], mask: bool broadcastable to [B, H, L, T]
// (true = attend; every row must allow at least one key) or undefined (no mask).
// causal (mask undefined, T == L): query i attends keys 0..i, without a mask tensor.
// at::scaled_dot_product_attention (flash / memory-efficient / cuDNN kernels where they apply:
// on CUDA only without a mask). Returns [B, H, L, D].
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask, double scale, bool causal = false);

// Block-diagonal attention over a packed sequence: segment i is rows
// [cu_seqlens[i], cu_seqlens[i+1]); tokens attend only inside their segment (causal: and
// only to earlier tokens of it, the LLM's padding-free packing). Consecutive segments of
// equal length run as one batched call, so no [S, S] mask is ever built (an image of 16k
// patches would need 16k^2 scores per head with a dense mask). On CUDA in bf16/fp16 (head
// dim a multiple of 8, at most 256) the whole sequence is one flash-attention varlen call
// (at::_flash_attention_forward) instead: the LLM's packed rows and the vision tower's
// images and windows.
// q: [S, H, D], k/v: [S, Hkv, D] (GQA) -> [S, H, D]
torch::Tensor varlen_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const std::vector<int64_t>& cu_seqlens, double scale, bool causal = false);

// `visual.blocks.N.attn`: qkv (rows [q all heads, k, v]) and proj, both with bias.
class VisionAttentionImpl : public torch::nn::Module {
 public:
  VisionAttentionImpl(int64_t dim, int64_t num_heads, const torch::TensorOptions& opts);
  // x: [S, dim]; cos/sin: [S, D] fp32 (2D rotary); -> [S, dim]. sp (vision_split.h): x, cos
  // and sin are this rank's rows, cu_seqlens the whole padded sequence's segments; attention
  // runs over every patch with H / cp heads.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const std::vector<int64_t>& cu_seqlens, SequenceExchange* sp = nullptr);
  int64_t num_heads;
  Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(VisionAttention);

// Keys and values of one decoder layer for cached decoding: [B, Hkv, T, D].
struct LayerKv {
  torch::Tensor k, v;
};

// `model.layers.N.self_attn`: q/k/v_proj (with bias when cfg.attention_bias: Qwen2), o_proj
// without; with cfg.qk_norm (Qwen3) q_norm / k_norm, RMSNorm over head_dim of each head
// before the rotary; GQA; M-RoPE on the first cfg.rotary_dim() dims of each head (all of
// them but in Qwen3.5). With cfg.attn_output_gate (Qwen3.5's gated attention) q_proj yields
// [query, gate] per head (2 * head_dim rows each) and the attention output is multiplied by
// sigmoid(gate) before o_proj.
class TextAttentionImpl : public torch::nn::Module {
 public:
  TextAttentionImpl(const TextConfig& cfg, const torch::TensorOptions& opts);
  // x: [B, L, d]; cos/sin: [B, L, R] (R = rotary dims, activation dtype); mask: bool [B, 1, L, T];
  // cache: when given, the new keys/values are appended to it and attention runs over all.
  // cu_seqlens (packed row, B == 1, no mask, no cache): causal attention inside each
  // segment [cu[i], cu[i+1]) only. sp (no cache): x, cos and sin are this rank's Ls = L / cp
  // tokens, cu_seqlens the whole sequence's; Ulysses: mask [B, 1, L, L], attention runs over
  // every token with H / cp heads (sequence_parallel.h); ring: mask is the key padding
  // [B, L] bool, this rank's queries attend every key block in turn (ring_attention.h).
  // -> [B, L or Ls, d]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask, LayerKv* cache,
                        const std::vector<int64_t>* cu_seqlens = nullptr, SequenceExchange* sp = nullptr);
  int64_t num_heads, num_kv_heads, head_dim;
  bool output_gate;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  Norm q_norm{nullptr}, k_norm{nullptr};  // null without qk_norm

 private:
  // o: [B, L, H*D], gate: [B, L, H*D] or undefined -> o_proj(o * sigmoid(gate)): [B, L, d]
  torch::Tensor out(const torch::Tensor& o, const torch::Tensor& gate);
};
TORCH_MODULE(TextAttention);

}  // namespace vlm
