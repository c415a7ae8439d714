// Registry entries of Qwen2-VL and Qwen2.5-VL: config.json key tables, architecture
// features, presets, vision tower, processor and chat defaults. The two families share
// their text decoder and most keys; the vision sections differ (see the trap in config.h).
#include <cmath>

#include "vlm/runtime/check.h"
#include "vlm/families/config_json.h"
#include "vlm/families/registry.h"
#include "vlm/families/qwen2_vision.h"

namespace vlm {
namespace {

using namespace config_json;

// ---------------------------------------------------------------- config.json key tables
// Absent keys take the defaults of transformers 5.23's Qwen2VLConfig / Qwen2_5_VLConfig
// (and their vision and text sub-configs), so that a stripped config.json means what it
// means to HF (tests/vlm/model/config_test.cpp has transformers parse the same files). Those
// defaults describe the 7B/72B models, not a small one: a config missing its sizes loads
// as HF would load it, and then fails on the checkpoint's shapes.

// Both families: the text keys (top level in the legacy layout, else text_config) and the
// top-level special ids.
template <class W, class C>
void q2_text_keys(W& top, W& text, C& c) {
  auto& t = c.text;
  text("vocab_size", t.vocab_size, 152064);
  text("hidden_size", t.hidden_size, 8192);
  text("intermediate_size", t.intermediate_size, 29568);
  text("num_hidden_layers", t.num_hidden_layers, 80);
  text("num_attention_heads", t.num_attention_heads, 64);
  text("num_key_value_heads", t.num_key_value_heads, 8);  // null: num_attention_heads (a step)
  text("rms_norm_eps", t.rms_norm_eps, 1e-5);
  text.id("pad_token_id", t.pad_token_id);
  text("rope_theta", t.rope_theta, 1e6);
  text("max_position_embeddings", t.max_position_embeddings, 32768);
  text("hidden_act", t.hidden_act, "silu");
  top("image_token_id", c.image_token_id, 151655);
  top("video_token_id", c.video_token_id, 151656);
  top("vision_start_token_id", c.vision_start_token_id, 151652);
  top("vision_end_token_id", c.vision_end_token_id, 151653);
}

// Qwen2-VL. Steps in code: mlp_ratio (intermediate_size = int(embed_dim * mlp_ratio)), the
// written alias in_chans; the text steps of q2_parse / q2_to_json.
template <class W, class C>
void qwen2_vl_keys(W& top, W& text, W& vision, C& c) {
  auto& v = c.vision;
  vision("depth", v.depth, 32);
  vision("num_heads", v.num_heads, 16);
  vision("patch_size", v.patch_size, 14);
  vision("temporal_patch_size", v.temporal_patch_size, 2);
  vision("spatial_merge_size", v.spatial_merge_size, 2);
  vision("in_channels", v.in_chans, 3);  // HF reads in_channels, not the hub configs' in_chans
  vision("embed_dim", v.embed_dim, 1280);            // the ViT width
  vision("hidden_size", v.out_hidden_size, 3584);    // the trap: the merger OUTPUT width
  vision("hidden_act", v.hidden_act, "quick_gelu");
  q2_text_keys(top, text, c);
}

// Qwen2.5-VL. Steps in code: tokens_per_second written as an int when integral, the
// written alias in_chans; the text steps of q2_parse / q2_to_json.
template <class W, class C>
void qwen2_5_vl_keys(W& top, W& text, W& vision, C& c) {
  auto& v = c.vision;
  vision("depth", v.depth, 32);
  vision("num_heads", v.num_heads, 16);
  vision("patch_size", v.patch_size, 14);
  vision("temporal_patch_size", v.temporal_patch_size, 2);
  vision("spatial_merge_size", v.spatial_merge_size, 2);
  vision("in_channels", v.in_chans, 3);
  vision("hidden_size", v.embed_dim, 3584);  // the ViT width here
  vision("out_hidden_size", v.out_hidden_size, 3584);
  vision("intermediate_size", v.intermediate_size, 3420);
  vision("hidden_act", v.hidden_act, "silu");
  vision("window_size", v.window_size, 112);
  vision("fullatt_block_indexes", v.fullatt_block_indexes, {7, 15, 23, 31});
  vision("tokens_per_second", v.tokens_per_second, 4.0);
  q2_text_keys(top, text, c);
}

// The table of Qwen2-VL (v2) or Qwen2.5-VL.
template <class W, class C>
void q2_keys(bool v2, W& top, W& text, W& vision, C& c) {
  if (v2)
    qwen2_vl_keys(top, text, vision, c);
  else
    qwen2_5_vl_keys(top, text, vision, c);
}

// ---------------------------------------------------------------- features
// What generic code reads instead of the family (config.h): the ViT's norm and MLP, and how
// image frames move the M-RoPE time. Window attention is vision.window_size > 0 (Qwen2.5-VL
// only: Qwen2-VL has no such key and keeps 0).
void qwen2_vl_features(VlmConfig& c) {
  c.vision.norm = NormKind::layer_norm;
  c.vision.mlp = MlpKind::quick_gelu;
  c.text.image_frames_advance_time = true;
}

void qwen2_5_vl_features(VlmConfig& c) {
  c.vision.norm = NormKind::rms_norm;
  c.vision.mlp = MlpKind::gated_silu;
  c.text.image_frames_advance_time = false;
}

// ---------------------------------------------------------------- parse, write, validate

VlmConfig q2_parse(const json& top, const std::string& src, bool v2) {
  VlmConfig c;
  // Text decoder: `text_config` when present (then, as in HF, the top-level text keys are
  // not read at all), else the top level (the legacy layout).
  auto tit = top.find("text_config");
  const bool nested = tit != top.end() && tit->is_object();
  const json& tj = nested ? *tit : top;
  const std::string tw = nested ? "text_config." : "";
  const json& vj = object_or_empty(top, "vision_config", src);
  KeyReader r_top(top, "", src), r_text(tj, tw, src), r_vision(vj, "vision_config.", src);
  q2_keys(v2, r_top, r_text, r_vision, c);

  VisionConfig& v = c.vision;
  if (v2) {
    const double ratio = get_opt<double>(vj, "mlp_ratio", 4.0, "vision_config.", src);
    const double inter = static_cast<double>(v.embed_dim) * ratio;  // HF: int(embed_dim * mlp_ratio)
    VLM_CHECK(std::isfinite(inter) && inter >= 1 && inter <= double(kMaxConfigSize), src,
              ": vision_config.mlp_ratio ", ratio, " x embed_dim ", v.embed_dim,
              " gives an MLP width outside [1, ", kMaxConfigSize, "]");
    v.intermediate_size = static_cast<int64_t>(inter);
  }
  const std::string want_act = v2 ? "quick_gelu" : "silu";
  VLM_CHECK(v.hidden_act == want_act, src, ": vision_config.hidden_act is '", v.hidden_act,
            "', expected '", want_act, "' for ", v2 ? "qwen2_vl" : "qwen2_5_vl");
  TextConfig& t = c.text;
  parse_text_steps(tj, t, src);
  parse_rope(tj, t, tw, src);
  // Sliding-window attention (layers >= max_window_layers when use_sliding_window) is not
  // implemented: refuse rather than attend over the full sequence where HF would not.
  if (get_opt<bool>(tj, "use_sliding_window", false, tw, src)) {
    const int64_t mwl = get_opt<int64_t>(tj, "max_window_layers", 80, tw, src);
    VLM_CHECK(mwl >= t.num_hidden_layers, src, ": ", tw, "use_sliding_window is true with ",
              tw, "max_window_layers ", mwl, " < num_hidden_layers ", t.num_hidden_layers,
              ": sliding-window attention is not supported (hint: every released Qwen2-VL / "
              "Qwen2.5-VL config has use_sliding_window false)");
  }
  parse_top_steps(top, tj, tw, /*text_tie_counts=*/nested, c, src);
  if (v2)
    qwen2_vl_features(c);
  else
    qwen2_5_vl_features(c);
  return c;
}

// The legacy layout (text keys at the top level), which every transformers version loads.
json q2_to_json(const VlmConfig& c, bool v2) {
  const ModelFamilySpec& spec = family_spec(c.family);
  json j, vj;
  KeyWriter w_top(j), w_text(j), w_vision(vj);
  q2_keys(v2, w_top, w_text, w_vision, c);

  const auto& v = c.vision;
  vj["in_chans"] = v.in_chans;  // as the hub configs write it, beside in_channels
  if (v2) {
    // An int when exact, as hub configs write it (transformers 5 validates the field as int).
    if (v.intermediate_size % v.embed_dim == 0)
      vj["mlp_ratio"] = v.intermediate_size / v.embed_dim;
    else
      vj["mlp_ratio"] = static_cast<double>(v.intermediate_size) / static_cast<double>(v.embed_dim);
  } else {
    vj["tokens_per_second"] = int_if_integral(v.tokens_per_second);  // transformers 5: an int
  }
  j["vision_config"] = vj;
  j["model_type"] = spec.model_type;
  j["architectures"] = {spec.architecture};
  j["rope_scaling"] = {{"type", "mrope"}, {"rope_type", "default"}, {"mrope_section", c.text.mrope_section}};
  j["attention_dropout"] = 0.0;
  j["use_sliding_window"] = false;
  j["max_window_layers"] = c.text.num_hidden_layers;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["vision_token_id"] = c.image_token_id - 1;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["torch_dtype"] = c.torch_dtype;
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

// ---------------------------------------------------------------- presets

VlmConfig real_qwen2_vl(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv,
                        int64_t vocab, bool tie) {
  VlmConfig c;
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
  qwen2_vl_features(c);
  return c;
}

VlmConfig real_qwen2_5_vl(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv,
                          int64_t vocab, bool tie) {
  VlmConfig c = real_qwen2_vl(hidden, inter, layers, heads, kv, vocab, tie);
  c.vision.intermediate_size = 3420;
  c.vision.hidden_act = "silu";
  c.vision.window_size = 112;
  c.vision.fullatt_block_indexes = {7, 15, 23, 31};
  c.text.max_position_embeddings = 128000;
  qwen2_5_vl_features(c);
  return c;
}

// Small enough to train on one CPU in minutes, large enough to learn OCR on synthetic data.
VlmConfig tiny_qwen2_vl() {
  VlmConfig c;
  c.vision.depth = 4;
  c.vision.embed_dim = 128;
  c.vision.num_heads = 4;  // head_dim 32
  c.vision.out_hidden_size = 256;
  c.vision.intermediate_size = 512;
  c.vision.hidden_act = "quick_gelu";
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
  // positions. See docs/notes/tiny_convergence.md.
  c.text.mrope_section = {2, 2, 28};
  c.text.rope_theta = 100.0;
  c.text.max_position_embeddings = 4096;
  top_of_vocab_special_ids(c);  // 2041..2047
  c.tie_word_embeddings = true;
  c.torch_dtype = "float32";
  qwen2_vl_features(c);
  return c;
}

// The Qwen2.5-VL tiny: tiny's sizes with a gated SiLU ViT and window attention.
VlmConfig tiny_qwen2_5_vl() {
  VlmConfig c = tiny_qwen2_vl();
  c.vision.intermediate_size = 344;
  c.vision.hidden_act = "silu";
  c.vision.window_size = 56;  // 2x2 merged tokens per window: exercised by 4x4-token images
  c.vision.fullatt_block_indexes = {1, 3};
  qwen2_5_vl_features(c);
  return c;
}

// ~8x tiny (41.0M parameters: vision 14.2M incl. merger 3.1M, LLM 26.8M): the benchmark
// size (bench/, scripts/bench.sh), about a second per CPU step at a few samples per rank.
VlmConfig small() {
  VlmConfig c = tiny_qwen2_vl();
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
  return std::make_shared<Qwen2VisionEncoderImpl>(cfg, opts);
}

// Both families' hub preprocessor_config.json: CLIP mean/std, 56x56 .. 28x28x16384 pixels.
const ProcessorDefaults kQwen2Processor{{0.48145466, 0.4578275, 0.40821073},
                                        {0.26862954, 0.26130258, 0.27577711}, 3136, 12845056};

}  // namespace

const ModelFamilySpec& qwen2_vl_family() {
  static const ModelFamilySpec spec = [] {
    ModelFamilySpec s;
    s.model_type = "qwen2_vl";
    s.architecture = "Qwen2VLForConditionalGeneration";
    s.display_name = "Qwen2-VL";
    s.nested_names = false;
    s.processor = kQwen2Processor;
    s.default_system = "You are a helpful assistant.";
    s.parse = [](const json& top, const std::string& src) { return q2_parse(top, src, /*v2=*/true); };
    s.to_json = [](const VlmConfig& c) { return q2_to_json(c, /*v2=*/true); };
    s.make_vision = q2_make_vision;
    s.presets = {{"tiny", tiny_qwen2_vl},
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
    s.model_type = "qwen2_5_vl";
    s.architecture = "Qwen2_5_VLForConditionalGeneration";
    s.display_name = "Qwen2.5-VL";
    s.parse = [](const json& top, const std::string& src) { return q2_parse(top, src, /*v2=*/false); };
    s.to_json = [](const VlmConfig& c) { return q2_to_json(c, /*v2=*/false); };
    s.validate = q25_validate;
    s.presets = {{"tiny-qwen2.5", tiny_qwen2_5_vl},
                 {"qwen2.5-vl-3b", [] { return real_qwen2_5_vl(2048, 11008, 36, 16, 2, 151936, true); }},
                 {"qwen2.5-vl-7b", [] { return real_qwen2_5_vl(3584, 18944, 28, 28, 4, 152064, false); }},
                 {"qwen2.5-vl-32b", [] { return real_qwen2_5_vl(5120, 27648, 64, 40, 8, 152064, false); }},
                 {"qwen2.5-vl-72b", [] { return real_qwen2_5_vl(8192, 29568, 80, 64, 8, 152064, false); }}};
    return s;
  }();
  return spec;
}

}  // namespace vlm
