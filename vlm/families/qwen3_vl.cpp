// Registry entry of Qwen3-VL (dense): its config.json key table (always the nested layout:
// text_config + vision_config), architecture features, presets with the published configs,
// its vision tower (qwen3_vision.h), processor and chat defaults.
#include <algorithm>
#include <cmath>

#include "vlm/runtime/check.h"
#include "vlm/families/config_json.h"
#include "vlm/families/registry.h"
#include "vlm/families/qwen3_vision.h"
#include "vlm/families/qwen3_vl.h"

namespace vlm::qwen3_vl {
namespace {

using namespace config_json;

// ---------------------------------------------------------------- config.json key table
// Absent keys take transformers 5.23's Qwen3VLVisionConfig / Qwen3VLTextConfig defaults.
// Steps in code (q3_parse / q3_to_json): the text rotary (rope_theta, rope_scaling or
// rope_parameters), head_dim written resolved, the vision rotary base
// (vision_config.rope_parameters.rope_theta), the tied head, bos / eos and dtype, and the
// constants transformers expects (model_type of each section, attention_bias false).
template <class W, class C>
void qwen3_vl_keys(W& top, W& text, W& vision, C& c, const TextDefaults& d) {
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
  vision("deepstack_visual_indexes", v.deepstack_visual_indexes, {8, 16, 24});
  vision("hidden_act", v.hidden_act, "gelu_pytorch_tanh");
  auto& t = c.text;
  text("vocab_size", t.vocab_size, 151936);
  text("hidden_size", t.hidden_size, d.hidden_size);
  text("intermediate_size", t.intermediate_size, d.intermediate_size);
  text("num_hidden_layers", t.num_hidden_layers, d.num_hidden_layers);
  text("num_attention_heads", t.num_attention_heads, d.num_attention_heads);
  text("num_key_value_heads", t.num_key_value_heads, d.num_key_value_heads);  // null: num_attention_heads (a step)
  text("rms_norm_eps", t.rms_norm_eps, 1e-6);
  text.id("pad_token_id", t.pad_token_id);
  text("max_position_embeddings", t.max_position_embeddings, 128000);
  text("hidden_act", t.hidden_act, "silu");
  text("head_dim", t.explicit_head_dim, d.head_dim);
  top("image_token_id", c.image_token_id, 151655);
  top("video_token_id", c.video_token_id, 151656);
  top("vision_start_token_id", c.vision_start_token_id, 151652);
  top("vision_end_token_id", c.vision_end_token_id, 151653);
}

// Qwen3VLTextConfig's defaults.
constexpr TextDefaults kDense{4096, 22016, 32, 32, 32, 128};

}  // namespace

// ---------------------------------------------------------------- features
// What generic code reads instead of the family (config.h): a LayerNorm ViT with a tanh-GELU
// MLP and full attention, images at M-RoPE time 0, a Qwen3 decoder (q/k norm, no attention
// bias, interleaved M-RoPE: HF's Qwen3-VL rotary always interleaves, the key is
// informational).
void features(VlmConfig& c) {
  c.vision.norm = NormKind::layer_norm;
  c.vision.mlp = MlpKind::gelu_tanh;
  c.text.image_frames_advance_time = false;
  c.text.attention_bias = false;
  c.text.qk_norm = true;
  c.text.mrope_interleaved = true;
}

// ---------------------------------------------------------------- parse, write, validate
// Always the nested layout: text_config + vision_config.
VlmConfig parse(const json& top, const std::string& src, const TextDefaults& d) {
  VlmConfig c;
  const json& vj = object_or_empty(top, "vision_config", src);
  const json& tj = object_or_empty(top, "text_config", src);
  const std::string tw = "text_config.";
  TextConfig& t = c.text;
  t.mrope_section = {24, 20, 20};  // HF: rope_parameters.get("mrope_section", [24, 20, 20])
  KeyReader r_top(top, "", src), r_text(tj, tw, src), r_vision(vj, "vision_config.", src);
  qwen3_vl_keys(r_top, r_text, r_vision, c, d);

  VLM_CHECK(c.vision.hidden_act == "gelu_pytorch_tanh", src, ": vision_config.hidden_act is '",
            c.vision.hidden_act, "', expected 'gelu_pytorch_tanh' for qwen3_vl");
  const json& vrope = object_or_empty(vj, "rope_parameters", src);
  c.vision.rope_theta = get_opt<double>(vrope, "rope_theta", 10000.0, "vision_config.rope_parameters.", src);
  parse_text_steps(tj, t, src);
  t.rope_theta = get_opt<double>(tj, "rope_theta", 500000.0, tw, src);
  parse_rope(tj, t, tw, src);
  VLM_CHECK(!get_opt<bool>(tj, "attention_bias", false, tw, src), src, ": ", tw,
            "attention_bias is true: biases on q/k/v/o_proj are not supported for qwen3_vl (hint: "
            "every released Qwen3-VL config has attention_bias false)");
  // Tied head: the top-level key only (Qwen3VLConfig does not read text_config's flag).
  parse_top_steps(top, tj, tw, /*text_tie_counts=*/false, c, src);
  features(c);
  return c;
}

json to_json(const VlmConfig& c, const TextDefaults& d) {
  const auto& t = c.text;
  json tj, vj, j;
  KeyWriter w_top(j), w_text(tj), w_vision(vj);
  qwen3_vl_keys(w_top, w_text, w_vision, c, d);
  tj["model_type"] = "qwen3_vl_text";
  tj["head_dim"] = t.head_dim();  // resolved (0 in a file means hidden / heads)
  tj["attention_bias"] = false;
  tj["attention_dropout"] = 0.0;
  tj["rope_parameters"] = {{"rope_type", "default"},
                           {"rope_theta", t.rope_theta},
                           {"mrope_section", t.mrope_section},
                           {"mrope_interleaved", true}};
  tj["bos_token_id"] = c.bos_token_id;
  tj["eos_token_id"] = c.eos_token_id;
  tj["tie_word_embeddings"] = c.tie_word_embeddings;
  tj["dtype"] = c.torch_dtype;
  vj["model_type"] = "qwen3_vl";
  vj["rope_parameters"] = {{"rope_type", "axial"}, {"rope_theta", c.vision.rope_theta}};
  j["model_type"] = "qwen3_vl";
  j["architectures"] = {"Qwen3VLForConditionalGeneration"};
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["dtype"] = c.torch_dtype;
  j["text_config"] = tj;
  j["vision_config"] = vj;
  return j;
}

void validate(const VlmConfig& c, const std::string& src) {
  const auto& v = c.vision;
  check_position_table(v, src);
  for (size_t i = 0; i < v.deepstack_visual_indexes.size(); ++i) {
    const int64_t b = v.deepstack_visual_indexes[i];
    // Entries >= depth name no block (a model cut to fewer blocks): never run, as in HF.
    VLM_CHECK(b >= 0, src, ": vision_config.deepstack_visual_indexes entry ", b, " is negative");
    VLM_CHECK(std::count(v.deepstack_visual_indexes.begin(), v.deepstack_visual_indexes.end(), b) == 1, src,
              ": vision_config.deepstack_visual_indexes lists block ", b, " twice");
  }
  VLM_CHECK(c.text.qk_norm && !c.text.attention_bias && c.text.mrope_interleaved, src,
            ": a qwen3_vl config must have q/k norm, no attention bias and interleaved M-RoPE");
}

// The published configs (Qwen/Qwen3-VL-{2B,4B,8B}-Instruct config.json): vision towers of
// 24 x 1024 (2B, 4B) and 27 x 1152 (8B) with DeepStack at blocks 5/11/17 and 8/16/24.
VlmConfig real(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, bool tie, bool large_vit) {
  VlmConfig c;
  auto& v = c.vision;
  v.depth = large_vit ? 27 : 24;
  v.embed_dim = large_vit ? 1152 : 1024;
  v.intermediate_size = large_vit ? 4304 : 4096;
  v.num_heads = 16;
  v.patch_size = 16;
  v.out_hidden_size = hidden;
  v.num_position_embeddings = 2304;
  v.deepstack_visual_indexes = large_vit ? std::vector<int64_t>{8, 16, 24} : std::vector<int64_t>{5, 11, 17};
  v.hidden_act = "gelu_pytorch_tanh";
  auto& t = c.text;
  t.vocab_size = 151936;
  t.hidden_size = hidden;
  t.intermediate_size = inter;
  t.num_hidden_layers = layers;
  t.num_attention_heads = heads;
  t.num_key_value_heads = 8;
  t.explicit_head_dim = 128;
  t.mrope_section = {24, 20, 20};
  t.rope_theta = 5000000.0;
  t.max_position_embeddings = 262144;
  c.tie_word_embeddings = tie;
  features(c);
  return c;
}

// The Qwen3-VL counterpart of the "tiny" preset (trainable on one CPU): 16-px patches, a
// 16 x 16 position table, DeepStack from blocks 1 and 2 into LLM layers 0 and 1, text
// head_dim 32 given explicitly (heads x head_dim = 128 != hidden 256, as in the real 4B/8B).
namespace {

VlmConfig tiny_qwen3() {
  VlmConfig c;
  auto& v = c.vision;
  v.depth = 4;
  v.embed_dim = 128;
  v.num_heads = 4;
  v.intermediate_size = 512;
  v.patch_size = 16;
  v.out_hidden_size = 256;
  v.num_position_embeddings = 256;
  v.deepstack_visual_indexes = {1, 2};
  v.hidden_act = "gelu_pytorch_tanh";
  auto& t = c.text;
  t.vocab_size = 2048;
  t.hidden_size = 256;
  t.intermediate_size = 768;
  t.num_hidden_layers = 4;
  t.num_attention_heads = 4;
  t.num_key_value_heads = 2;
  t.explicit_head_dim = 32;
  t.mrope_section = {4, 6, 6};
  t.rope_theta = 1000.0;
  t.max_position_embeddings = 4096;
  top_of_vocab_special_ids(c);  // 2041..2047, as tiny
  c.tie_word_embeddings = true;
  c.torch_dtype = "float32";
  features(c);
  return c;
}

}  // namespace
}  // namespace vlm::qwen3_vl

namespace vlm {

const ModelFamilySpec& qwen3_vl_family() {
  using namespace qwen3_vl;
  static const ModelFamilySpec spec = [] {
    ModelFamilySpec s;
    s.model_type = "qwen3_vl";
    s.architecture = "Qwen3VLForConditionalGeneration";
    s.display_name = "Qwen3-VL";
    s.nested_names = true;
    // The hub preprocessor_config.json: mean/std 0.5, size {shortest_edge 65536,
    // longest_edge 16777216} (256^2 .. 4096^2 pixels).
    s.processor = {{0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}, 65536, 16777216};
    s.default_system = "";  // the Qwen3-VL chat template adds no system turn
    s.parse = [](const nlohmann::json& top, const std::string& src) { return qwen3_vl::parse(top, src, kDense); };
    s.to_json = [](const VlmConfig& c) { return qwen3_vl::to_json(c, kDense); };
    s.validate = qwen3_vl::validate;
    s.make_vision = [](const VlmConfig& cfg, const torch::TensorOptions& opts) -> std::shared_ptr<VisionTowerImpl> {
      return std::make_shared<Qwen3VisionEncoderImpl>(cfg, opts);
    };
    s.presets = {{"tiny-qwen3", tiny_qwen3},
                 {"qwen3-vl-2b", [] { return real(2048, 6144, 28, 16, true, false); }},
                 {"qwen3-vl-4b", [] { return real(2560, 9728, 36, 32, true, false); }},
                 {"qwen3-vl-8b", [] { return real(4096, 12288, 36, 32, false, true); }}};
    return s;
  }();
  return spec;
}

}  // namespace vlm
