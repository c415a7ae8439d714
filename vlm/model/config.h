// Model configuration: plain structs, HF config.json parsing and export, built-in presets.
// Which architecture a config describes is its `family`, the model_type of a registry entry
// (vlm/families/registry.h); everything that differs per family (its config.json keys,
// presets, vision tower, processor and chat defaults) lives in the family's own files behind
// that entry. What generic code needs to know of an architecture is a feature field below
// (vision norm and MLP kind, window attention, q/k norm, M-RoPE layout, ...), set by the
// family's parser and presets: generic code reads features, never the family's identity.
// This file holds the shared structs and dispatches by `model_type`.
//
// The one trap: in Qwen2-VL's `vision_config`, `hidden_size` is the merger OUTPUT width and
// `embed_dim` the ViT width; in Qwen2.5-VL `hidden_size` is the ViT width and
// `out_hidden_size` the merger output. Here the fields have one meaning for both families.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlm/model/layer_kinds.h"

namespace vlm {

// The HF model_type of a registered family, checked against the registry; throws vlm::Error
// listing the registered ones when `family` names none (an empty, hand-built config).
std::string family_name(const std::string& family);
// Every registered family's model_type, in registry order.
std::vector<std::string> family_names();

struct VisionConfig {
  int64_t depth = 0;                // number of ViT blocks
  int64_t embed_dim = 0;            // ViT width (2-VL key `embed_dim`, 2.5 key `hidden_size`)
  int64_t num_heads = 0;            // attention heads; head_dim = embed_dim / num_heads
  int64_t intermediate_size = 0;    // MLP width (2-VL: embed_dim * mlp_ratio)
  int64_t out_hidden_size = 0;      // merger output = text hidden (2-VL key `hidden_size`)
  int64_t patch_size = 14;          // spatial patch side in pixels
  int64_t temporal_patch_size = 2;  // frames per patch (an image is repeated to 2 frames)
  int64_t spatial_merge_size = 2;   // merger groups merge x merge patches into one token
  int64_t in_chans = 3;             // image channels
  std::string hidden_act;           // "quick_gelu" (2-VL, fc1/fc2) | "silu" (2.5, gated)
  int64_t window_size = 0;          // 2.5: window side in pixels (112 -> 4x4 merged tokens)
  std::vector<int64_t> fullatt_block_indexes;  // 2.5: blocks attending over the full image
  double tokens_per_second = 2.0;   // 2.5: temporal position scale (videos only; presets 2 as
                                    // the released models, absent from config.json: 4 as HF)
  double norm_eps = 1e-6;           // ViT and merger norms (hard-coded in HF)
  double rope_theta = 10000.0;      // 2-D rotary base of the ViT
  int64_t num_position_embeddings = 0;  // Qwen3: learned position table of side^2 entries,
                                        // bilinearly resampled to each image's grid
  std::vector<int64_t> deepstack_visual_indexes;  // Qwen3: blocks whose output feeds a
                                                  // DeepStack merger (added to LLM layer k)
  // Features, set by the family's parser and presets (the towers and the cost models read
  // them instead of the family):
  NormKind norm = NormKind::layer_norm;  // ViT block norms and the merger's per-patch norm
  MlpKind mlp = MlpKind::quick_gelu;     // ViT block MLP, the kind hidden_act names

  int64_t head_dim() const { return embed_dim / num_heads; }
  int64_t patch_dim() const { return in_chans * temporal_patch_size * patch_size * patch_size; }
  int64_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
  // Window attention (window_size > 0): blocks outside fullatt_block_indexes attend within
  // windows of merged tokens, the tokens permuted window by window (as Qwen2.5-VL's ViT).
  bool window_attention() const { return window_size > 0; }
};

struct TextConfig {
  int64_t vocab_size = 0;           // rows of embed_tokens / lm_head
  int64_t hidden_size = 0;          // d
  int64_t intermediate_size = 0;    // MLP width I
  int64_t num_hidden_layers = 0;    // decoder layers
  int64_t num_attention_heads = 0;  // query heads
  int64_t num_key_value_heads = 0;  // kv heads (GQA)
  double rms_norm_eps = 1e-6;       // presets: 1e-6 as the released models; absent from
                                    // config.json: 1e-5 (HF's class default)
  double rope_theta = 1e6;          // rotary base
  std::vector<int64_t> mrope_section{16, 24, 24};  // frequencies per stream (T, H, W)
  int64_t max_position_embeddings = 32768;
  std::string hidden_act = "silu";
  // config.json's pad_token_id (absent or null: -1, none). HF makes it embed_tokens'
  // padding_idx: that row never receives a gradient, so it is never trained.
  int64_t pad_token_id = -1;
  int64_t explicit_head_dim = 0;    // config.json head_dim (Qwen3); 0 = hidden / heads
  bool attention_bias = true;       // q/k/v_proj biases (Qwen2: true, Qwen3: false)
  bool qk_norm = false;             // Qwen3: RMSNorm over head_dim on q and k (q_norm, k_norm)
  bool mrope_interleaved = false;   // Qwen3: frequency k takes stream k % 3 (within the
                                    // sections); Qwen2: consecutive sections T, H, W
  // Feature: M-RoPE of image tokens. true: frame k of an image takes temporal offset k (as
  // Qwen2-VL); false: every image token takes offset 0 (Qwen2.5-VL scales time by a video's
  // seconds per frame, 0 for an image; Qwen3-VL likewise).
  bool image_frames_advance_time = false;
  // Features of hybrid decoders (Qwen3.5); the defaults describe Qwen2 / Qwen3:
  NormKind norm = NormKind::rms_norm;  // decoder norms (layer norms, final norm, q/k norms);
                                       // Qwen3.5: rms_norm_centered, x * (1 + w)
  std::vector<MixerKind> layer_types;  // token mixer of each layer; empty: all full attention
  double partial_rotary_factor = 1.0;  // rotary on the first head_dim * factor dims of q / k
                                       // (Qwen3.5: 0.25); M-RoPE sections sum to half of that
  bool attn_output_gate = false;       // Qwen3.5 gated attention: q_proj yields [query, gate]
                                       // per head, the output is attn * sigmoid(gate)
  // Gated DeltaNet geometry (linear_attention layers; 0 without any):
  int64_t linear_num_key_heads = 0;    // q / k heads
  int64_t linear_num_value_heads = 0;  // v heads (a multiple of the key heads)
  int64_t linear_key_head_dim = 0;     // Dk
  int64_t linear_value_head_dim = 0;   // Dv
  int64_t linear_conv_kernel_dim = 4;  // depthwise causal conv over q, k, v
  // Mixture of experts (Qwen3-VL-MoE, Qwen3.5-MoE; vlm/model/moe.h). num_experts = 0: every
  // layer has the dense MLP (intermediate_size).
  int64_t num_experts = 0;                      // E routed experts per sparse layer
  int64_t num_experts_per_tok = 0;              // k: experts each token is routed to (top-k)
  int64_t moe_intermediate_size = 0;            // each expert's SwiGLU width
  int64_t shared_expert_intermediate_size = 0;  // Qwen3.5-MoE: the always-on shared expert
                                                // (scaled by sigmoid(shared_expert_gate)); 0 = none
  int64_t decoder_sparse_step = 1;              // layer i is sparse when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;         // ... and i is not listed here (dense MLP)
  bool output_router_logits = false;            // config.json keys kept for export; training
  double router_aux_loss_coef = 0.001;          // uses the recipe's train.router_aux_loss_coef
  // Not from config.json: the tensor-parallel degree the model is built for (dist.tp;
  // tensor_parallel.h): embed_tokens / lm_head hold vocab_size / tp rows and each decoder
  // layer heads / tp heads and intermediate_size / tp channels. 1: whole.
  int64_t tensor_parallel = 1;

  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads; }
  // Rotated dims of each q / k head (HF: int(head_dim * partial_rotary_factor)).
  int64_t rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim()) * partial_rotary_factor); }
  MixerKind mixer(int64_t layer) const {
    return layer_types.empty() ? MixerKind::full_attention : layer_types[static_cast<size_t>(layer)];
  }
  int64_t count_layers(MixerKind kind) const;
  // Whether layer i has the sparse MoE block as its `mlp` (HF's rule: experts exist, i is not
  // in mlp_only_layers and (i + 1) % decoder_sparse_step == 0).
  bool sparse_layer(int64_t layer) const;
  int64_t count_sparse_layers() const;
};

struct VlmConfig {
  std::string family;  // the registry entry's model_type; set by parse_hf_config and preset
  VisionConfig vision;
  TextConfig text;
  int64_t image_token_id = 151655;         // <|image_pad|>
  int64_t video_token_id = 151656;         // <|video_pad|>
  int64_t vision_start_token_id = 151652;  // <|vision_start|>
  int64_t vision_end_token_id = 151653;    // <|vision_end|>
  int64_t bos_token_id = 151643;           // <|endoftext|>
  int64_t eos_token_id = 151645;           // <|im_end|>
  bool tie_word_embeddings = false;        // lm_head uses model.embed_tokens.weight
  std::string torch_dtype = "bfloat16";    // dtype of the checkpoint
};

// Bounds validate() enforces, far above any real model, so that no size product overflows.
constexpr int64_t kMaxConfigSize = int64_t(1) << 24;   // widths, heads, vocab, window
constexpr int64_t kMaxConfigLayers = 4096;             // depth, num_hidden_layers
constexpr int64_t kMaxPatchGeometry = 1024;            // patch, temporal, merge, channels

// Keys absent from the file take transformers 5.23's defaults (Qwen2VLConfig /
// Qwen2_5_VLConfig / Qwen3VLConfig and their sub-configs); with a `text_config` object the top-level text
// keys are ignored, as in HF. Throws vlm::Error naming `source_name` and the key when a
// value has the wrong type or is out of range.
VlmConfig parse_hf_config(const std::string& json_text, const std::string& source_name);
// `dir_or_file`: an HF model directory (reads config.json) or a config.json path.
VlmConfig load_hf_config(const std::string& dir_or_file);
// An HF config.json (legacy layout: text fields top-level) that transformers loads.
nlohmann::json to_hf_json(const VlmConfig& cfg);

// Built-in presets of every family in the registry (tiny, small, qwen2-vl-2b, ...: the
// families' own lists, in registry order).
VlmConfig preset(const std::string& name);
std::vector<std::string> preset_names();

// Checks bounds and internal consistency (divisibility, section sums); throws vlm::Error.
void validate(const VlmConfig& cfg, const std::string& source_name);

}  // namespace vlm
