// Registry entry of Qwen3.5 (dense 0.8B-27B; Qwen3.6 / 3.8 reuse it): a hybrid decoder of
// Gated DeltaNet (`linear_attn`) and gated-attention (`self_attn`) layers, three linear to one
// full by default, with zero-centred RMSNorms and partial interleaved M-RoPE; the Qwen3-VL
// vision tower without DeepStack (qwen3_vision.h). Its config.json key table (always nested:
// text_config + vision_config), features, presets with the published geometry, processor
// and chat defaults.
#include <algorithm>
#include <cmath>

#include "vlm/runtime/check.h"
#include "vlm/families/config_json.h"
#include "vlm/families/registry.h"
#include "vlm/families/qwen3_vision.h"
#include "vlm/families/qwen3_5.h"

namespace vlm::qwen3_5 {
namespace {

using namespace config_json;

// Special ids of the Qwen3.5 vocabulary (specials from 248044: <|endoftext|>, <|im_start|>,
// <|im_end|>, ...).
constexpr int64_t kEndOfText = 248044, kImEnd = 248046;

// ---------------------------------------------------------------- config.json key table
// Absent keys take transformers 5.23's Qwen3_5VisionConfig / Qwen3_5TextConfig defaults.
// Steps in code (q35_parse / q35_to_json): layer_types (or full_attention_interval), the
// rotary (rope_parameters: rope_theta, partial_rotary_factor, mrope_section), the tied head
// (top-level flag), bos / eos and dtype, and the constants transformers expects.
template <class W, class C>
void qwen3_5_keys(W& top, W& text, W& vision, C& c, const TextDefaults& d) {
  auto& v = c.vision;
  vision("depth", v.depth, 27);
  vision("hidden_size", v.embed_dim, 1152);
  vision("intermediate_size", v.intermediate_size, 4304);
  vision("num_heads", v.num_heads, 16);
  vision("in_channels", v.in_chans, 3);
  vision("patch_size", v.patch_size, 16);
  vision("spatial_merge_size", v.spatial_merge_size, 2);
  vision("temporal_patch_size", v.temporal_patch_size, 2);
  vision("out_hidden_size", v.out_hidden_size, 3584);
  vision("num_position_embeddings", v.num_position_embeddings, 2304);
  vision("hidden_act", v.hidden_act, "gelu_pytorch_tanh");
  auto& t = c.text;
  text("vocab_size", t.vocab_size, 248320);
  text("hidden_size", t.hidden_size, d.hidden_size);
  if (d.intermediate_size > 0) text("intermediate_size", t.intermediate_size, d.intermediate_size);  // MoE: none
  text("num_hidden_layers", t.num_hidden_layers, d.num_hidden_layers);
  text("num_attention_heads", t.num_attention_heads, d.num_attention_heads);
  text("num_key_value_heads", t.num_key_value_heads, d.num_key_value_heads);
  text("rms_norm_eps", t.rms_norm_eps, 1e-6);
  text.id("pad_token_id", t.pad_token_id);
  text("max_position_embeddings", t.max_position_embeddings, 32768);
  text("hidden_act", t.hidden_act, "silu");
  text("head_dim", t.explicit_head_dim, d.head_dim);
  text("linear_conv_kernel_dim", t.linear_conv_kernel_dim, 4);
  text("linear_key_head_dim", t.linear_key_head_dim, 128);
  text("linear_value_head_dim", t.linear_value_head_dim, 128);
  text("linear_num_key_heads", t.linear_num_key_heads, 16);
  text("linear_num_value_heads", t.linear_num_value_heads, 32);
  top("image_token_id", c.image_token_id, 248056);
  top("video_token_id", c.video_token_id, 248057);
  top("vision_start_token_id", c.vision_start_token_id, 248053);
  top("vision_end_token_id", c.vision_end_token_id, 248054);
}

// Qwen3_5TextConfig's defaults.
constexpr TextDefaults kDense{4096, 12288, 32, 16, 4, 256};

}  // namespace

// ---------------------------------------------------------------- features
// A LayerNorm ViT with a tanh-GELU MLP, no DeepStack, images at M-RoPE time 0; a decoder with
// zero-centred RMSNorms (x * (1 + w)), q/k norms, gated attention without biases and
// interleaved M-RoPE (HF's Qwen3.5 rotary always interleaves).
void features(VlmConfig& c) {
  c.vision.norm = NormKind::layer_norm;
  c.vision.mlp = MlpKind::gelu_tanh;
  c.vision.deepstack_visual_indexes.clear();
  c.text.image_frames_advance_time = false;
  c.text.attention_bias = false;
  c.text.qk_norm = true;
  c.text.mrope_interleaved = true;
  c.text.attn_output_gate = true;
  c.text.norm = NormKind::rms_norm_centered;
}

namespace {

// HF: `layer_types` when given, else every `full_attention_interval`-th layer (default 4)
// full attention, the others linear.
std::vector<MixerKind> parse_layer_types(const json& tj, int64_t layers, const std::string& tw, const std::string& src) {
  std::vector<MixerKind> out;
  if (tj.contains("layer_types") && !tj["layer_types"].is_null()) {
    const auto names = get_req<std::vector<std::string>>(tj, "layer_types", tw, src);
    for (size_t i = 0; i < names.size(); ++i) {
      VLM_CHECK(names[i] == "full_attention" || names[i] == "linear_attention", src, ": ", tw, "layer_types[", i,
                "] is '", names[i], "', expected 'full_attention' or 'linear_attention'");
      out.push_back(names[i] == "full_attention" ? MixerKind::full_attention : MixerKind::linear_attention);
    }
    return out;
  }
  const int64_t interval = get_opt<int64_t>(tj, "full_attention_interval", 4, tw, src);
  VLM_CHECK(interval >= 1, src, ": ", tw, "full_attention_interval is ", interval, ", expected >= 1");
  for (int64_t i = 0; i < layers; ++i)
    out.push_back((i + 1) % interval == 0 ? MixerKind::full_attention : MixerKind::linear_attention);
  return out;
}

// rope_parameters (rope_scaling in older files): rope_theta (default 10000), mrope_section
// ([11, 11, 10]), partial_rotary_factor (there, else a text-level key, else 0.25).
void parse_rotary(const json& tj, TextConfig& t, const std::string& tw, const std::string& src) {
  t.rope_theta = get_opt<double>(tj, "rope_theta", 10000.0, tw, src);
  t.mrope_section = {11, 11, 10};
  t.partial_rotary_factor = get_opt<double>(tj, "partial_rotary_factor", 0.25, tw, src);
  parse_rope(tj, t, tw, src);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json& r = object_or_empty(tj, key, src);
    if (r.empty()) continue;
    t.partial_rotary_factor = get_opt<double>(r, "partial_rotary_factor", t.partial_rotary_factor, tw + key + ".", src);
    break;
  }
  t.mrope_interleaved = true;
}

}  // namespace

// ---------------------------------------------------------------- parse, write, validate
VlmConfig parse(const json& top, const std::string& src, const TextDefaults& d) {
  VlmConfig c;
  const json& vj = object_or_empty(top, "vision_config", src);
  const json& tj = object_or_empty(top, "text_config", src);
  const std::string tw = "text_config.";
  KeyReader r_top(top, "", src), r_text(tj, tw, src), r_vision(vj, "vision_config.", src);
  qwen3_5_keys(r_top, r_text, r_vision, c, d);
  VLM_CHECK(c.vision.hidden_act == "gelu_pytorch_tanh", src, ": vision_config.hidden_act is '", c.vision.hidden_act,
            "', expected 'gelu_pytorch_tanh' for qwen3_5");
  c.vision.rope_theta = get_opt<double>(object_or_empty(vj, "rope_parameters", src), "rope_theta", 10000.0,
                                        "vision_config.rope_parameters.", src);
  TextConfig& t = c.text;
  parse_text_steps(tj, t, src);
  parse_rotary(tj, t, tw, src);
  t.layer_types = parse_layer_types(tj, t.num_hidden_layers, tw, src);
  VLM_CHECK(!get_opt<bool>(tj, "attention_bias", false, tw, src), src, ": ", tw,
            "attention_bias is true: biases on q/k/v/o_proj are not supported for qwen3_5 (hint: every "
            "released Qwen3.5 config has attention_bias false)");
  parse_top_steps(top, tj, tw, /*text_tie_counts=*/false, c, src);  // the top-level flag ties (as HF)
  auto absent = [&](const char* key) {
    return (!tj.contains(key) || tj[key].is_null()) && (!top.contains(key) || top[key].is_null());
  };
  if (absent("bos_token_id")) c.bos_token_id = kEndOfText;
  if (absent("eos_token_id")) c.eos_token_id = kImEnd;
  features(c);
  return c;
}

json to_json(const VlmConfig& c, const TextDefaults& d) {
  const auto& t = c.text;
  json tj, vj, j;
  KeyWriter w_top(j), w_text(tj), w_vision(vj);
  qwen3_5_keys(w_top, w_text, w_vision, c, d);
  std::vector<std::string> types;
  for (int64_t i = 0; i < t.num_hidden_layers; ++i)
    types.push_back(t.mixer(i) == MixerKind::full_attention ? "full_attention" : "linear_attention");
  tj["model_type"] = "qwen3_5_text";
  tj["layer_types"] = types;
  tj["head_dim"] = t.head_dim();
  tj["attention_bias"] = false;
  tj["attention_dropout"] = 0.0;
  tj["rope_parameters"] = {{"rope_type", "default"},
                           {"rope_theta", t.rope_theta},
                           {"partial_rotary_factor", t.partial_rotary_factor},
                           {"mrope_section", t.mrope_section},
                           {"mrope_interleaved", true}};
  tj["bos_token_id"] = c.bos_token_id;
  tj["eos_token_id"] = c.eos_token_id;
  tj["tie_word_embeddings"] = c.tie_word_embeddings;
  tj["dtype"] = c.torch_dtype;
  vj["model_type"] = "qwen3_5_vision";
  vj["rope_parameters"] = {{"rope_type", "axial"}, {"rope_theta", c.vision.rope_theta}};
  j["model_type"] = "qwen3_5";
  j["architectures"] = {"Qwen3_5ForConditionalGeneration"};
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["dtype"] = c.torch_dtype;
  j["text_config"] = tj;
  j["vision_config"] = vj;
  return j;
}

void validate(const VlmConfig& c, const std::string& src) {
  const auto& v = c.vision;
  check_position_table(v, src);
  VLM_CHECK(v.deepstack_visual_indexes.empty(), src, ": qwen3_5 has no DeepStack mergers");
  const auto& t = c.text;
  VLM_CHECK(t.qk_norm && !t.attention_bias && t.mrope_interleaved && t.attn_output_gate &&
                t.norm == NormKind::rms_norm_centered,
            src, ": a qwen3_5 config must have q/k norm, gated attention without bias, interleaved M-RoPE and "
            "zero-centred RMSNorms");
  VLM_CHECK(static_cast<int64_t>(t.layer_types.size()) == t.num_hidden_layers, src, ": ",
            "text_config.layer_types has ", t.layer_types.size(), " entries, expected num_hidden_layers = ",
            t.num_hidden_layers);
}

// ---------------------------------------------------------------- presets

// The published geometry (Qwen/Qwen3.5-*: hidden / layers / heads / kv / intermediate /
// linear key and value heads; every 4th layer full attention; head_dim 256, linear head
// dims 128; partial rotary 0.25 with M-RoPE [11, 11, 10] interleaved, theta 1e7; vocab
// 248,320; patch 16, merge 2, 48 x 48 learned positions).
VlmConfig real(const Geometry& g) {
  VlmConfig c;
  auto& v = c.vision;
  v.depth = g.vit_depth;
  v.embed_dim = g.vit_width;
  v.intermediate_size = g.vit_inter;
  v.num_heads = g.vit_heads;
  v.patch_size = 16;
  v.out_hidden_size = g.hidden;
  v.num_position_embeddings = 2304;
  v.hidden_act = "gelu_pytorch_tanh";
  auto& t = c.text;
  t.vocab_size = 248320;
  t.hidden_size = g.hidden;
  t.intermediate_size = g.inter;
  t.num_hidden_layers = g.layers;
  t.num_attention_heads = g.heads;
  t.num_key_value_heads = g.kv_heads;
  t.explicit_head_dim = 256;
  t.linear_num_key_heads = g.lin_k_heads;
  t.linear_num_value_heads = g.lin_v_heads;
  t.linear_key_head_dim = 128;
  t.linear_value_head_dim = 128;
  t.linear_conv_kernel_dim = 4;
  for (int64_t i = 0; i < g.layers; ++i)
    t.layer_types.push_back((i + 1) % 4 == 0 ? MixerKind::full_attention : MixerKind::linear_attention);
  t.partial_rotary_factor = 0.25;
  t.mrope_section = {11, 11, 10};
  t.rope_theta = 10000000.0;
  t.max_position_embeddings = 262144;
  c.image_token_id = 248056;
  c.video_token_id = 248057;
  c.vision_start_token_id = 248053;
  c.vision_end_token_id = 248054;
  c.bos_token_id = kEndOfText;
  c.eos_token_id = kImEnd;
  c.tie_word_embeddings = g.tie;
  features(c);
  return c;
}

// The Qwen3.5 counterpart of "tiny-qwen3" (trainable on one CPU): three linear layers and
// one full, head_dim 64 of which 16 rotate (M-RoPE 3 + 3 + 2), 2 key heads serving 4 value
// heads in the linear layers, a 4-block ViT of 128 with a 16 x 16 position table.
namespace {

VlmConfig tiny_qwen3_5() {
  VlmConfig c;
  auto& v = c.vision;
  v.depth = 4;
  v.embed_dim = 128;
  v.num_heads = 4;
  v.intermediate_size = 512;
  v.patch_size = 16;
  v.out_hidden_size = 256;
  v.num_position_embeddings = 256;
  v.hidden_act = "gelu_pytorch_tanh";
  auto& t = c.text;
  t.vocab_size = 2048;
  t.hidden_size = 256;
  t.intermediate_size = 768;
  t.num_hidden_layers = 4;
  t.num_attention_heads = 4;
  t.num_key_value_heads = 2;
  t.explicit_head_dim = 64;
  t.linear_num_key_heads = 2;
  t.linear_num_value_heads = 4;
  t.linear_key_head_dim = 32;
  t.linear_value_head_dim = 32;
  t.layer_types = {MixerKind::linear_attention, MixerKind::linear_attention, MixerKind::linear_attention,
                   MixerKind::full_attention};
  t.partial_rotary_factor = 0.25;
  t.mrope_section = {3, 3, 2};
  t.rope_theta = 10000.0;
  t.max_position_embeddings = 4096;
  top_of_vocab_special_ids(c);  // 2041..2047, as tiny
  c.tie_word_embeddings = true;
  c.torch_dtype = "float32";
  features(c);
  return c;
}

}  // namespace
}  // namespace vlm::qwen3_5

namespace vlm {

const ModelFamilySpec& qwen3_5_family() {
  using namespace qwen3_5;
  static const ModelFamilySpec spec = [] {
    ModelFamilySpec s;
    s.model_type = "qwen3_5";
    s.architecture = "Qwen3_5ForConditionalGeneration";
    s.display_name = "Qwen3.5";
    s.nested_names = true;
    // As Qwen3-VL's preprocessor_config.json: mean/std 0.5, 256^2 .. 4096^2 pixels.
    s.processor = {{0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}, 65536, 16777216};
    s.default_system = "";
    s.chat_template = ChatTemplate::kQwen3_5;  // think blocks: docs/qwen35_text.md
    s.parse = [](const nlohmann::json& top, const std::string& src) { return qwen3_5::parse(top, src, kDense); };
    s.to_json = [](const VlmConfig& c) { return qwen3_5::to_json(c, kDense); };
    s.validate = qwen3_5::validate;
    s.make_vision = [](const VlmConfig& cfg, const torch::TensorOptions& opts) -> std::shared_ptr<VisionTowerImpl> {
      return std::make_shared<Qwen3VisionEncoderImpl>(cfg, opts);
    };
    //                    hidden layers heads kv  inter   lin k  lin v  ViT  depth  ffn  heads  tie
    s.presets = {{"tiny-qwen3.5", tiny_qwen3_5},
                 {"qwen3.5-0.8b", [] { return real({1024, 24, 8, 2, 3584, 16, 16, 768, 12, 3072, 12, true}); }},
                 {"qwen3.5-2b", [] { return real({2048, 24, 8, 2, 6144, 16, 16, 1024, 24, 4096, 16, true}); }},
                 {"qwen3.5-4b", [] { return real({2560, 32, 16, 4, 9216, 16, 32, 1024, 24, 4096, 16, true}); }},
                 {"qwen3.5-9b", [] { return real({4096, 32, 16, 4, 12288, 16, 32, 1152, 27, 4304, 16, false}); }},
                 {"qwen3.5-27b", [] { return real({5120, 64, 24, 4, 17408, 16, 48, 1152, 27, 4304, 16, false}); }}};
    return s;
  }();
  return spec;
}

}  // namespace vlm
