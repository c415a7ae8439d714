// The kinds of the shared layers that an architecture picks: which norm, which MLP and which
// token mixer a vision tower or decoder builds. Plain enums, apart from the layers (layers.h, mlp.h), so
// that a config (config.h) can name them as features and the cost models can read them.
#pragma once

namespace vlm {

enum class NormKind {
  layer_norm,  // (x - mean) / sqrt(var + eps) * weight + bias
  rms_norm,    // fp32: x * rsqrt(mean(x^2) + eps), cast to input dtype, times weight
  rms_norm_centered,  // fp32: x * rsqrt(mean(x^2) + eps) * (1 + weight), cast to input dtype;
                      // weight initialised to zeros (Qwen3.5's zero-centred RMSNorm)
};

enum class MlpKind {
  quick_gelu,  // fc2(quick_gelu(fc1 x)), quick_gelu(x) = x * sigmoid(1.702 x)
  gelu_tanh,   // linear_fc2(gelu_tanh(linear_fc1 x)) (HF gelu_pytorch_tanh)
  gated_silu,  // down_proj(silu(gate_proj x) * up_proj x)
};

// The token mixer of a decoder layer (TextConfig::layer_types).
enum class MixerKind {
  full_attention,    // `self_attn`: softmax attention over the causal prefix (TextAttention)
  linear_attention,  // `linear_attn`: Gated DeltaNet, a recurrent state per head (GatedDeltaNet)
};

}  // namespace vlm
