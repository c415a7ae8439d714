// Registry entries of Qwen2-VL and Qwen2.5-VL: config.json keys, presets, vision tower,
// processor and chat defaults. The two families share their text decoder and most keys; the
// vision sections differ (see the trap in config.h).
#include <cmath>

#include "vlm/runtime/check.h"
#include "vlm/families/config_json.h"
#include "vlm/families/registry.h"
#include "vlm/families/qwen2_vision.h"

namespace vlm {
namespace {

using namespace config_json;

// Absent keys take the defaults of transformers 5.23's Qwen2VLConfig / Qwen2_5_VLConfig
// (and their vision and text sub-configs), so that a stripped config.json means what it
// means to HF (tests/vlm/model/config_test.cpp has transformers parse the same files). Those
// defaults describe the 7B/72B models, not a small one: a config missing its sizes loads
// as HF would load it, and then fails on the checkpoint's shapes.
void q2_parse_vision(const json& vj, bool v2, VisionConfig& v, const std::string& src) {
  // HF reads `in_channels`; the `in_chans` of hub configs is not a key it knows.
  const std::string vw = "vision_config.";
  v.depth = get_opt<int64_t>(vj, "depth", 32, vw, src);
  v.num_heads = get_opt<int64_t>(vj, "num_heads", 16, vw, src);
  v.patch_size = get_opt<int64_t>(vj, "patch_size", 14, vw, src);
  v.temporal_patch_size = get_opt<int64_t>(vj, "temporal_patch_size", 2, vw, src);
  v.spatial_merge_size = get_opt<int64_t>(vj, "spatial_merge_size", 2, vw, src);
  v.in_chans = get_opt<int64_t>(vj, "in_channels", 3, vw, src);
  if (v2) {
    v.embed_dim = get_opt<int64_t>(vj, "embed_dim", 1280, vw, src);
    v.out_hidden_size = get_opt<int64_t>(vj, "hidden_size", 3584, vw, src);  // merger output!
    const double ratio = get_opt<double>(vj, "mlp_ratio", 4.0, vw, src);
    const double inter = static_cast<double>(v.embed_dim) * ratio;  // HF: int(embed_dim * mlp_ratio)
    VLM_CHECK(std::isfinite(inter) && inter >= 1 && inter <= double(kMaxConfigSize), src,
              ": vision_config.mlp_ratio ", ratio, " x embed_dim ", v.embed_dim,
              " gives an MLP width outside [1, ", kMaxConfigSize, "]");
    v.intermediate_size = static_cast<int64_t>(inter);
    v.hidden_act = get_opt<std::string>(vj, "hidden_act", "quick_gelu", vw, src);
  } else {
    v.embed_dim = get_opt<int64_t>(vj, "hidden_size", 3584, vw, src);  // ViT width
    v.out_hidden_size = get_opt<int64_t>(vj, "out_hidden_size", 3584, vw, src);
    v.intermediate_size = get_opt<int64_t>(vj, "intermediate_size", 3420, vw, src);
    v.hidden_act = get_opt<std::string>(vj, "hidden_act", "silu", vw, src);
    v.window_size = get_opt<int64_t>(vj, "window_size", 112, vw, src);
    v.fullatt_block_indexes = get_opt<std::vector<int64_t>>(vj, "fullatt_block_indexes",
                                                            {7, 15, 23, 31}, vw, src);
    v.tokens_per_second = get_opt<double>(vj, "tokens_per_second", 4.0, vw, src);
  }
  const std::string want_act = v2 ? "quick_gelu" : "silu";
  VLM_CHECK(v.hidden_act == want_act, src, ": vision_config.hidden_act is '", v.hidden_act,
            "', expected '", want_act, "' for ", v2 ? "qwen2_vl" : "qwen2_5_vl");
}

VlmConfig q2_parse(const json& top, const std::string& src, bool v2) {
  VlmConfig c;
  q2_parse_vision(object_or_empty(top, "vision_config", src), v2, c.vision, src);
  // Text decoder: `text_config` when present (then, as in HF, the top-level text keys are
  // not read at all), else the top level (the legacy layout).
  auto tit = top.find("text_config");
  const bool nested = tit != top.end() && tit->is_object();
  const json& tj = nested ? *tit : top;
  const std::string tw = nested ? "text_config." : "";
  TextConfig& t = c.text;
  parse_text_common(tj, tw, {152064, 8192, 29568, 80, 64, 8, 1e-5, 1e6, 32768}, t, src);
  // Sliding-window attention (layers >= max_window_layers when use_sliding_window) is not
  // implemented: refuse rather than attend over the full sequence where HF would not.
  if (get_opt<bool>(tj, "use_sliding_window", false, tw, src)) {
    const int64_t mwl = get_opt<int64_t>(tj, "max_window_layers", 80, tw, src);
    VLM_CHECK(mwl >= t.num_hidden_layers, src, ": ", tw, "use_sliding_window is true with ",
              tw, "max_window_layers ", mwl, " < num_hidden_layers ", t.num_hidden_layers,
              ": sliding-window attention is not supported (hint: every released Qwen2-VL / "
              "Qwen2.5-VL config has use_sliding_window false)");
  }
  parse_top_common(top, tj, tw, nested, c, src);
  return c;
}

json q2_to_json(const VlmConfig& c) {
  json j;
  const bool v2 = c.family == Family::qwen2_vl;
  j["model_type"] = family_name(c.family);
  j["architectures"] = {family_spec(c.family).architecture};
  j["vocab_size"] = c.text.vocab_size;
  j["hidden_size"] = c.text.hidden_size;
  j["intermediate_size"] = c.text.intermediate_size;
  j["num_hidden_layers"] = c.text.num_hidden_layers;
  j["num_attention_heads"] = c.text.num_attention_heads;
  j["num_key_value_heads"] = c.text.num_key_value_heads;
  j["rms_norm_eps"] = c.text.rms_norm_eps;
  if (c.text.pad_token_id >= 0) j["pad_token_id"] = c.text.pad_token_id;
  j["rope_theta"] = c.text.rope_theta;
  j["rope_scaling"] = {{"type", "mrope"}, {"rope_type", "default"}, {"mrope_section", c.text.mrope_section}};
  j["max_position_embeddings"] = c.text.max_position_embeddings;
  j["hidden_act"] = c.text.hidden_act;
  j["attention_dropout"] = 0.0;
  j["use_sliding_window"] = false;
  j["max_window_layers"] = c.text.num_hidden_layers;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["image_token_id"] = c.image_token_id;
  j["video_token_id"] = c.video_token_id;
  j["vision_start_token_id"] = c.vision_start_token_id;
  j["vision_end_token_id"] = c.vision_end_token_id;
  j["vision_token_id"] = c.image_token_id - 1;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["torch_dtype"] = c.torch_dtype;
  const auto& v = c.vision;
  json vj;
  vj["depth"] = v.depth;
  vj["num_heads"] = v.num_heads;
  vj["patch_size"] = v.patch_size;
  vj["temporal_patch_size"] = v.temporal_patch_size;
  vj["spatial_merge_size"] = v.spatial_merge_size;
  vj["in_chans"] = v.in_chans;
  vj["in_channels"] = v.in_chans;
  vj["hidden_act"] = v.hidden_act;
  if (v2) {
    vj["embed_dim"] = v.embed_dim;
    vj["hidden_size"] = v.out_hidden_size;
    // An int when exact, as hub configs write it (transformers 5 validates the field as int).
    if (v.intermediate_size % v.embed_dim == 0)
      vj["mlp_ratio"] = v.intermediate_size / v.embed_dim;
    else
      vj["mlp_ratio"] = static_cast<double>(v.intermediate_size) / static_cast<double>(v.embed_dim);
  } else {
    vj["hidden_size"] = v.embed_dim;
    vj["out_hidden_size"] = v.out_hidden_size;
    vj["intermediate_size"] = v.intermediate_size;
    vj["window_size"] = v.window_size;
    vj["fullatt_block_indexes"] = v.fullatt_block_indexes;
    // An int when integral: transformers 5 validates the field as int (2.0 is refused).
    if (v.tokens_per_second == std::floor(v.tokens_per_second) && std::fabs(v.tokens_per_second) < 1e9)
      vj["tokens_per_second"] = static_cast<int64_t>(v.tokens_per_second);
    else
      vj["tokens_per_second"] = v.tokens_per_second;
  }
  j["vision_config"] = vj;
  return j;
}

void q25_validate(const VlmConfig& c, const std::string& src) {
  const auto& v = c.vision;
  const int64_t unit = v.spatial_merge_size * v.patch_size;  // >= 1: both bounded above
  VLM_CHECK(v.window_size >= unit && v.window_size <= kMaxConfigSize && v.window_size % unit == 0,
            src, ": vision window_size ", v.window_size,
            " must be a positive multiple of patch_size*spatial_merge_size = ", unit);
  // Entries >= depth name no block (a model cut to fewer blocks), as in HF: ignored.
  for (int64_t b : v.fullatt_block_indexes)
    VLM_CHECK(b >= 0, src, ": fullatt_block_indexes entry ", b, " is negative");
}

VlmConfig real_qwen2_vl(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv,
                        int64_t vocab, bool tie) {
  VlmConfig c;
  c.family = Family::qwen2_vl;
  c.vision.depth = 32;
  c.vision.embed_dim = 1280;
  c.vision.num_heads = 16;
  c.vision.intermediate_size = 5120;
  c.vision.out_hidden_size = hidden;
  c.vision.hidden_act = "quick_gelu";
  c.text.vocab_size = vocab;
  c.text.hidden_size = hidden;
  c.text.intermediate_size = inter;
  c.text.num_hidden_layers = layers;
  c.text.num_attention_heads = heads;
  c.text.num_key_value_heads = kv;
  c.tie_word_embeddings = tie;
  return c;
}

VlmConfig real_qwen2_5_vl(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv,
                          int64_t vocab, bool tie) {
  VlmConfig c = real_qwen2_vl(hidden, inter, layers, heads, kv, vocab, tie);
  c.family = Family::qwen2_5_vl;
  c.vision.intermediate_size = 3420;
  c.vision.hidden_act = "silu";
  c.vision.window_size = 112;
  c.vision.fullatt_block_indexes = {7, 15, 23, 31};
  c.text.max_position_embeddings = 128000;
  return c;
}

// Small enough to train on one CPU in minutes, large enough to learn OCR on synthetic data.
VlmConfig tiny(Family family) {
  VlmConfig c;
  c.family = family;
  c.vision.depth = 4;
  c.vision.embed_dim = 128;
  c.vision.num_heads = 4;  // head_dim 32
  c.vision.out_hidden_size = 256;
  if (family == Family::qwen2_vl) {
    c.vision.intermediate_size = 512;
    c.vision.hidden_act = "quick_gelu";
  } else {
    c.vision.intermediate_size = 344;
    c.vision.hidden_act = "silu";
    c.vision.window_size = 56;  // 2x2 merged tokens per window: exercised by 4x4-token images
    c.vision.fullatt_block_indexes = {1, 3};
  }
  c.text.vocab_size = 2048;
  c.text.hidden_size = 256;
  c.text.intermediate_size = 768;
  c.text.num_hidden_layers = 4;
  c.text.num_attention_heads = 4;  // head_dim 64
  c.text.num_key_value_heads = 2;
  // M-RoPE for a model trained from scratch: HF's split gives the temporal, height and
  // width sections the highest, middle and lowest frequencies, so with {8, 12, 12} and
  // theta 1e4 one image column turns the width dims by at most 0.003 rad and the LLM
  // cannot tell columns apart. Width gets 28 of 32 frequencies and theta 100 (0.56..0.012
  // rad per column); text-only tokens see plain RoPE with theta 100, ample for a few hundred
  // positions. See docs/tiny_convergence.md.
  c.text.mrope_section = {2, 2, 28};
  c.text.rope_theta = 100.0;
  c.text.max_position_embeddings = 4096;
  top_of_vocab_special_ids(c);  // 2041..2047
  c.tie_word_embeddings = true;
  c.torch_dtype = "float32";
  return c;
}

// ~8x tiny (41.0M parameters: vision 14.2M incl. merger 3.1M, LLM 26.8M): the benchmark
// size (bench/, scripts/bench.sh), about a second per CPU step at a few samples per rank.
VlmConfig small() {
  VlmConfig c = tiny(Family::qwen2_vl);
  c.vision.depth = 6;
  c.vision.embed_dim = 384;
  c.vision.num_heads = 6;  // head_dim 64
  c.vision.intermediate_size = 1536;
  c.vision.out_hidden_size = 512;
  c.text.vocab_size = 8192;
  c.text.hidden_size = 512;
  c.text.intermediate_size = 1408;
  c.text.num_hidden_layers = 8;
  c.text.num_attention_heads = 8;  // head_dim 64
  c.text.num_key_value_heads = 2;
  top_of_vocab_special_ids(c);  // 8185..8191
  return c;
}

std::shared_ptr<VisionTowerImpl> q2_make_vision(const VlmConfig& cfg, const torch::TensorOptions& opts) {
  return std::make_shared<VisionEncoderImpl>(cfg, opts);
}

// Both families' hub preprocessor_config.json: CLIP mean/std, 56x56 .. 28x28x16384 pixels.
const ProcessorDefaults kQwen2Processor{{0.48145466, 0.4578275, 0.40821073},
                                        {0.26862954, 0.26130258, 0.27577711}, 3136, 12845056};

}  // namespace

const ModelFamilySpec& qwen2_vl_family() {
  static const ModelFamilySpec spec = [] {
    ModelFamilySpec s;
    s.family = Family::qwen2_vl;
    s.model_type = "qwen2_vl";
    s.architecture = "Qwen2VLForConditionalGeneration";
    s.display_name = "Qwen2-VL";
    s.nested_names = false;
    s.processor = kQwen2Processor;
    s.default_system = "You are a helpful assistant.";
    s.parse = [](const json& top, const std::string& src) { return q2_parse(top, src, true); };
    s.to_json = q2_to_json;
    s.make_vision = q2_make_vision;
    s.presets = {{"tiny", [] { return tiny(Family::qwen2_vl); }},
                 {"small", small},
                 {"qwen2-vl-2b", [] { return real_qwen2_vl(1536, 8960, 28, 12, 2, 151936, true); }},
                 {"qwen2-vl-7b", [] { return real_qwen2_vl(3584, 18944, 28, 28, 4, 152064, false); }}};
    return s;
  }();
  return spec;
}

const ModelFamilySpec& qwen2_5_vl_family() {
  static const ModelFamilySpec spec = [] {
    ModelFamilySpec s = qwen2_vl_family();
    s.family = Family::qwen2_5_vl;
    s.model_type = "qwen2_5_vl";
    s.architecture = "Qwen2_5_VLForConditionalGeneration";
    s.display_name = "Qwen2.5-VL";
    s.parse = [](const json& top, const std::string& src) { return q2_parse(top, src, false); };
    s.validate = q25_validate;
    s.presets = {{"tiny-qwen2.5", [] { return tiny(Family::qwen2_5_vl); }},
                 {"qwen2.5-vl-3b", [] { return real_qwen2_5_vl(2048, 11008, 36, 16, 2, 151936, true); }},
                 {"qwen2.5-vl-7b", [] { return real_qwen2_5_vl(3584, 18944, 28, 28, 4, 152064, false); }}};
    return s;
  }();
  return spec;
}

}  // namespace vlm
