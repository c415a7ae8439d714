// Gated DeltaNet: the linear-attention token mixer of Qwen3.5's hybrid decoder
// (`model.layers.N.linear_attn`), and the gated delta rule it computes.
//
// Per value head h and token t, with a recurrent state S [Dk, Dv]:
//   S = exp(g_t) * S                                   (decay, g_t <= 0)
//   S = S + k_t (beta_t * (v_t - S^T k_t))^T           (delta rule: write the correction)
//   o_t = S^T (q_t / sqrt(Dk))
// q and k are L2-normalised per head; q / k heads serve linear_num_value_heads /
// linear_num_key_heads consecutive value heads each. Training runs the chunked form (chunks
// of 64 tokens: a UT transform inside each chunk, the state carried across chunks), written
// with ATen ops so that it runs on CPU and CUDA and autograd differentiates it; decoding
// one token runs the recurrence directly. Both compute in fp32 for fp32 / bf16 / fp16
// inputs (as HF's torch path and the FLA kernels do), in float64 for float64 inputs, and
// return the input dtype.
//
// GPU: the chunked rule below is where a fused kernel goes (FLA's chunk_gated_delta_rule:
// one launch per layer, the chunk loop on-chip, varlen cu_seqlens native); the causal
// conv1d likewise (causal_conv1d_fn). Both keep these signatures.
//
// Names: B batch, L tokens, Hk key heads, Hv value heads, Dk / Dv head dims, C conv
// channels (2 Hk Dk + Hv Dv), K conv kernel.
#pragma once
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "vlm/model/config.h"
#include "vlm/model/layers.h"
#include "vlm/model/sequence_parallel.h"

namespace vlm {

// The chunked gated delta rule (HF torch_chunk_gated_delta_rule with
// use_qk_l2norm_in_kernel). q, k: [B, L, Hk, Dk]; v: [B, L, Hv, Dv]; g, beta: [B, L, Hv];
// initial_state: [B, Hv, Dk, Dv] or undefined (zeros).
// Returns {o [B, L, Hv, Dv] in v's dtype, final state [B, Hv, Dk, Dv] fp32 (float64 for
// float64 inputs)}.
std::pair<torch::Tensor, torch::Tensor> chunk_gated_delta_rule(const torch::Tensor& q, const torch::Tensor& k,
                                                               const torch::Tensor& v, const torch::Tensor& g,
                                                               const torch::Tensor& beta,
                                                               const torch::Tensor& initial_state,
                                                               int64_t chunk_size = 64);

// The same rule one token at a time (decoding); same shapes and result.
std::pair<torch::Tensor, torch::Tensor> recurrent_gated_delta_rule(const torch::Tensor& q, const torch::Tensor& k,
                                                                   const torch::Tensor& v, const torch::Tensor& g,
                                                                   const torch::Tensor& beta,
                                                                   const torch::Tensor& initial_state);

// Depthwise causal conv1d + SiLU over the time axis. x: [B, C, L]; weight: [C, 1, K];
// state: the K-1 inputs before x ([B, C, K-1]; undefined: zeros, a sequence start).
// Returns {y [B, C, L], the last K-1 inputs of cat(state, x) (the next call's state)}.
std::pair<torch::Tensor, torch::Tensor> causal_conv1d_silu(const torch::Tensor& x, const torch::Tensor& weight,
                                                           const torch::Tensor& state);

// `linear_attn.conv1d`: the depthwise conv's weight [C, 1, K], no bias (HF nn.Conv1d).
class DepthwiseConv1dImpl : public LayerBase {
 public:
  DepthwiseConv1dImpl(int64_t channels, int64_t kernel, const torch::TensorOptions& opts);
  ParamInit init_rule(const std::string& name) const override;
  torch::Tensor weight;

 protected:
  void rebind() override;
};
TORCH_MODULE(DepthwiseConv1d);

// `linear_attn.norm`: RMSNorm over Dv, gated: (w * rmsnorm(x).to(dtype)) * silu(z), in
// fp32, cast to x's dtype (HF Qwen3_5RMSNormGated; weight initialised to ones).
class GatedRmsNormImpl : public LayerBase {
 public:
  GatedRmsNormImpl(int64_t dim, double eps, const torch::TensorOptions& opts);
  // x, z: [..., dim] -> [..., dim]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& z);
  ParamInit init_rule(const std::string& name) const override;
  double eps;
  torch::Tensor weight;

 protected:
  void rebind() override;
};
TORCH_MODULE(GatedRmsNorm);

// Recurrent state of one linear-attention layer for cached decoding.
struct LinearAttentionState {
  torch::Tensor conv;       // [B, C, K-1]: the last conv inputs
  torch::Tensor recurrent;  // [B, Hv, Dk, Dv] fp32 (float64 for a float64 model)
};

// `model.layers.N.linear_attn`: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d,
// dt_bias [Hv], A_log [Hv], norm, out_proj (HF names). Decay g = -exp(A_log) *
// softplus(a + dt_bias), beta = sigmoid(b).
class GatedDeltaNetImpl : public LayerBase {
 public:
  GatedDeltaNetImpl(const TextConfig& cfg, const torch::TensorOptions& opts);
  // x: [B, L, d]; mask: [B, L] (1 = real; padded positions are zeroed before the mixer, as
  // HF does, so left padding leaves the state at zero) or undefined; state: when given,
  // continued from and updated (decoding); cu_seqlens (packed row, B == 1, no state): the
  // conv and the recurrent state restart at every segment [cu[i], cu[i+1]). -> [B, L, d]
  // sp (no state; sequence_parallel.h, either mode): x and mask are this rank's L / cp tokens
  // (sequence_layout), cu_seqlens the whole sequence's; the projections run on them, one
  // all-to-all gives this rank Hv / cp value heads (and their key heads, repeated when fewer
  // than cp) of every token, put in sequence order (ring: rank_order_to_sequence), the conv
  // and the rule run there with the heads' slices of conv1d, A_log and dt_bias, and a second
  // all-to-all brings the output back to the rank's tokens. -> [B, L or Ls, d]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask, LinearAttentionState* state,
                        const std::vector<int64_t>* cu_seqlens = nullptr, SequenceExchange* sp = nullptr);
  ParamInit init_rule(const std::string& name) const override;

  int64_t num_k_heads, num_v_heads, head_k_dim, head_v_dim;
  Linear in_proj_qkv{nullptr}, in_proj_z{nullptr}, in_proj_b{nullptr}, in_proj_a{nullptr}, out_proj{nullptr};
  DepthwiseConv1d conv1d{nullptr};
  GatedRmsNorm norm{nullptr};
  torch::Tensor dt_bias, A_log;

 protected:
  void rebind() override;

 private:
  // The heads a forward computes: all of them, or a sequence-parallel rank's (heads_of).
  struct Heads {
    int64_t hk = 0, hv = 0;              // key and value heads
    torch::Tensor conv_weight;           // [C_h, 1, K]: their conv channels (q, k, v)
    torch::Tensor A_log, dt_bias;        // [hv]
  };
  Heads all_heads();
  // Rank r's of cp (value heads [r Hv / cp, (r + 1) Hv / cp) and their key heads), and the
  // channels of [qkv | b | a] ([B, L, C + 2 Hv]) that carry them, in [q, k, v, b, a] order.
  Heads heads_of(int64_t r, int64_t cp, std::vector<int64_t>* channels);
  // One sequence span (a whole row, or one packed segment): conv, decays, rule. qkv: [B, l, C_h];
  // b, a: in_proj_b / in_proj_a outputs of the heads [B, l, hv] -> core output [B, l, hv, Dv]
  torch::Tensor mix(const torch::Tensor& qkv, const torch::Tensor& b, const torch::Tensor& a,
                    LinearAttentionState* state, const Heads& heads);
  // mix over a whole row, or per packed segment (cu: every sample from a zero state).
  torch::Tensor mix_row(const torch::Tensor& qkv, const torch::Tensor& b, const torch::Tensor& a,
                        LinearAttentionState* state, const std::vector<int64_t>* cu, const Heads& heads);
};
TORCH_MODULE(GatedDeltaNet);

}  // namespace vlm
