// Registry entry of Qwen3-VL (dense): config.json keys (always the nested layout:
// text_config + vision_config), presets with the published configs, its vision tower
// (qwen3_vision.h), processor and chat defaults.
#include <algorithm>
#include <cmath>

#include "vlm/runtime/check.h"
#include "vlm/families/config_json.h"
#include "vlm/families/registry.h"
#include "vlm/families/qwen3_vision.h"

namespace vlm {
namespace {

using namespace config_json;

// Absent keys take transformers 5.23's Qwen3VLVisionConfig / Qwen3VLTextConfig defaults.
void q3_parse_vision(const json& vj, VisionConfig& v, const std::string& src) {
  const std::string vw = "vision_config.";
  v.depth = get_opt<int64_t>(vj, "depth", 27, vw, src);
  v.embed_dim = get_opt<int64_t>(vj, "hidden_size", 1152, vw, src);
  v.intermediate_size = get_opt<int64_t>(vj, "intermediate_size", 4304, vw, src);
  v.num_heads = get_opt<int64_t>(vj, "num_heads", 16, vw, src);
  v.in_chans = get_opt<int64_t>(vj, "in_channels", 3, vw, src);
  v.patch_size = get_opt<int64_t>(vj, "patch_size", 16, vw, src);
  v.spatial_merge_size = get_opt<int64_t>(vj, "spatial_merge_size", 2, vw, src);
  v.temporal_patch_size = get_opt<int64_t>(vj, "temporal_patch_size", 2, vw, src);
  v.out_hidden_size = get_opt<int64_t>(vj, "out_hidden_size", 3584, vw, src);
  v.num_position_embeddings = get_opt<int64_t>(vj, "num_position_embeddings", 2304, vw, src);
  v.deepstack_visual_indexes = get_opt<std::vector<int64_t>>(vj, "deepstack_visual_indexes", {8, 16, 24}, vw, src);
  v.hidden_act = get_opt<std::string>(vj, "hidden_act", "gelu_pytorch_tanh", vw, src);
  VLM_CHECK(v.hidden_act == "gelu_pytorch_tanh", src, ": vision_config.hidden_act is '", v.hidden_act,
            "', expected 'gelu_pytorch_tanh' for qwen3_vl");
  const json& rope = object_or_empty(vj, "rope_parameters", src);
  v.rope_theta = get_opt<double>(rope, "rope_theta", 10000.0, vw + "rope_parameters.", src);
}

VlmConfig q3_parse(const json& top, const std::string& src) {
  VlmConfig c;
  q3_parse_vision(object_or_empty(top, "vision_config", src), c.vision, src);
  const json& tj = object_or_empty(top, "text_config", src);
  const std::string tw = "text_config.";
  TextConfig& t = c.text;
  t.mrope_section = {24, 20, 20};  // HF: rope_parameters.get("mrope_section", [24, 20, 20])
  parse_text_common(tj, tw, {151936, 4096, 22016, 32, 32, 32, 1e-6, 500000.0, 128000}, t, src);
  t.explicit_head_dim = get_opt<int64_t>(tj, "head_dim", 128, tw, src);
  VLM_CHECK(!get_opt<bool>(tj, "attention_bias", false, tw, src), src, ": ", tw,
            "attention_bias is true: biases on q/k/v/o_proj are not supported for qwen3_vl (hint: "
            "every released Qwen3-VL config has attention_bias false)");
  t.attention_bias = false;
  t.qk_norm = true;
  t.mrope_interleaved = true;  // HF's Qwen3-VL rotary always interleaves (the key is informational)
  // Tied head: the top-level key only (Qwen3VLConfig does not read text_config's flag).
  parse_top_common(top, tj, tw, /*text_tie_counts=*/false, c, src);
  return c;
}

json q3_to_json(const VlmConfig& c) {
  const auto& t = c.text;
  const auto& v = c.vision;
  json tj = {{"model_type", "qwen3_vl_text"},
             {"vocab_size", t.vocab_size},
             {"hidden_size", t.hidden_size},
             {"intermediate_size", t.intermediate_size},
             {"num_hidden_layers", t.num_hidden_layers},
             {"num_attention_heads", t.num_attention_heads},
             {"num_key_value_heads", t.num_key_value_heads},
             {"head_dim", t.head_dim()},
             {"hidden_act", t.hidden_act},
             {"max_position_embeddings", t.max_position_embeddings},
             {"rms_norm_eps", t.rms_norm_eps},
             {"attention_bias", false},
             {"attention_dropout", 0.0},
             {"rope_parameters",
              {{"rope_type", "default"}, {"rope_theta", t.rope_theta}, {"mrope_section", t.mrope_section},
               {"mrope_interleaved", true}}},
             {"bos_token_id", c.bos_token_id},
             {"eos_token_id", c.eos_token_id},
             {"tie_word_embeddings", c.tie_word_embeddings},
             {"dtype", c.torch_dtype}};
  if (t.pad_token_id >= 0) tj["pad_token_id"] = t.pad_token_id;
  json vj = {{"model_type", "qwen3_vl"},
             {"depth", v.depth},
             {"hidden_size", v.embed_dim},
             {"intermediate_size", v.intermediate_size},
             {"num_heads", v.num_heads},
             {"in_channels", v.in_chans},
             {"patch_size", v.patch_size},
             {"spatial_merge_size", v.spatial_merge_size},
             {"temporal_patch_size", v.temporal_patch_size},
             {"out_hidden_size", v.out_hidden_size},
             {"num_position_embeddings", v.num_position_embeddings},
             {"deepstack_visual_indexes", v.deepstack_visual_indexes},
             {"hidden_act", v.hidden_act},
             {"rope_parameters", {{"rope_type", "axial"}, {"rope_theta", v.rope_theta}}}};
  return {{"model_type", "qwen3_vl"},
          {"architectures", {"Qwen3VLForConditionalGeneration"}},
          {"image_token_id", c.image_token_id},
          {"video_token_id", c.video_token_id},
          {"vision_start_token_id", c.vision_start_token_id},
          {"vision_end_token_id", c.vision_end_token_id},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"dtype", c.torch_dtype},
          {"text_config", tj},
          {"vision_config", vj}};
}

void q3_validate(const VlmConfig& c, const std::string& src) {
  const auto& v = c.vision;
  const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(v.num_position_embeddings))));
  VLM_CHECK(v.num_position_embeddings >= 1 && v.num_position_embeddings <= kMaxConfigSize &&
                side * side == v.num_position_embeddings,
            src, ": vision_config.num_position_embeddings is ", v.num_position_embeddings,
            ", expected a square (a side x side table; released models: 2304 = 48^2)");
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
VlmConfig real_qwen3_vl(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, bool tie, bool large_vit) {
  VlmConfig c;
  c.family = Family::qwen3_vl;
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
  t.attention_bias = false;
  t.qk_norm = true;
  t.mrope_interleaved = true;
  t.mrope_section = {24, 20, 20};
  t.rope_theta = 5000000.0;
  t.max_position_embeddings = 262144;
  c.tie_word_embeddings = tie;
  return c;
}

// The Qwen3-VL counterpart of the "tiny" preset (trainable on one CPU): 16-px patches, a
// 16 x 16 position table, DeepStack from blocks 1 and 2 into LLM layers 0 and 1, text
// head_dim 32 given explicitly (heads x head_dim = 128 != hidden 256, as in the real 4B/8B).
VlmConfig tiny_qwen3() {
  VlmConfig c;
  c.family = Family::qwen3_vl;
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
  t.attention_bias = false;
  t.qk_norm = true;
  t.mrope_interleaved = true;
  t.mrope_section = {4, 6, 6};
  t.rope_theta = 1000.0;
  t.max_position_embeddings = 4096;
  top_of_vocab_special_ids(c);  // 2041..2047, as tiny
  c.tie_word_embeddings = true;
  c.torch_dtype = "float32";
  return c;
}

}  // namespace

const ModelFamilySpec& qwen3_vl_family() {
  static const ModelFamilySpec spec = [] {
    ModelFamilySpec s;
    s.family = Family::qwen3_vl;
    s.model_type = "qwen3_vl";
    s.architecture = "Qwen3VLForConditionalGeneration";
    s.display_name = "Qwen3-VL";
    s.nested_names = true;
    // The hub preprocessor_config.json: mean/std 0.5, size {shortest_edge 65536,
    // longest_edge 16777216} (256^2 .. 4096^2 pixels).
    s.processor = {{0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}, 65536, 16777216};
    s.default_system = "";  // the Qwen3-VL chat template adds no system turn
    s.parse = q3_parse;
    s.to_json = q3_to_json;
    s.validate = q3_validate;
    s.make_vision = [](const VlmConfig& cfg, const torch::TensorOptions& opts) -> std::shared_ptr<VisionTowerImpl> {
      return std::make_shared<Qwen3VisionEncoderImpl>(cfg, opts);
    };
    s.presets = {{"tiny-qwen3", tiny_qwen3},
                 {"qwen3-vl-2b", [] { return real_qwen3_vl(2048, 6144, 28, 16, true, false); }},
                 {"qwen3-vl-4b", [] { return real_qwen3_vl(2560, 9728, 36, 32, true, false); }},
                 {"qwen3-vl-8b", [] { return real_qwen3_vl(4096, 12288, 36, 32, false, true); }}};
    return s;
  }();
  return spec;
}

}  // namespace vlm
