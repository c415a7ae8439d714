#include "vlm/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <type_traits>

#include "vlm/check.h"

namespace vlm {
namespace {

using json = nlohmann::json;

// An integer that must be written as one: nlohmann converts floats to integers with a
// plain cast, which is undefined behaviour out of range (1e300) and silently truncates 2.5.
int64_t integer_value(const json& v, const std::string& what, const std::string& src) {
  VLM_CHECK(v.is_number_integer(), src, ": key '", what, "' must be an integer, found ",
            v.dump().substr(0, 64), " (a JSON ", v.type_name(), ")");
  VLM_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX), src, ": key '",
            what, "' = ", v.dump(), " does not fit in int64");
  return v.get<int64_t>();
}

// Reads `obj[key]` as T; `where` is the dotted path for messages ("vision_config.depth").
template <typename T>
T get_req(const json& obj, const std::string& key, const std::string& where, const std::string& src) {
  auto it = obj.find(key);
  VLM_CHECK(it != obj.end() && !it->is_null(), src, ": missing key '", where, key,
            "' (hint: is this a Qwen2-VL / Qwen2.5-VL config.json?)");
  if constexpr (std::is_same_v<T, int64_t>) {
    return integer_value(*it, where + key, src);
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    VLM_CHECK(it->is_array(), src, ": key '", where, key, "' must be a list of integers, found a JSON ",
              it->type_name());
    std::vector<int64_t> out;
    for (size_t i = 0; i < it->size(); ++i)
      out.push_back(integer_value((*it)[i], str(where, key, "[", i, "]"), src));
    return out;
  } else {
    try {
      return it->get<T>();
    } catch (const std::exception& e) {
      throw Error(str(src, ": key '", where, key, "' has the wrong type (", it->type_name(),
                      "): ", e.what()));
    }
  }
}

template <typename T>
T get_opt(const json& obj, const std::string& key, const T& dflt, const std::string& where,
          const std::string& src) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  return get_req<T>(obj, key, where, src);
}

// The rotary section: `rope_scaling` (legacy; HF takes it first) or `rope_parameters`
// (newer), of the text section.
void parse_rope(const json& text, const json& top, TextConfig& t, const std::string& src) {
  for (const json* obj : {&text, &top}) {
    for (const char* key : {"rope_scaling", "rope_parameters"}) {  // HF: rope_scaling wins
      auto it = obj->find(key);
      if (it == obj->end() || !it->is_object()) continue;
      const std::string where = std::string(key) + ".";
      if (it->contains("mrope_section"))
        t.mrope_section = get_req<std::vector<int64_t>>(*it, "mrope_section", where, src);
      if (it->contains("rope_theta")) t.rope_theta = get_req<double>(*it, "rope_theta", where, src);
      std::string type = get_opt<std::string>(*it, "rope_type", "", where, src);
      if (type.empty()) type = get_opt<std::string>(*it, "type", "", where, src);
      VLM_CHECK(type.empty() || type == "mrope" || type == "default", src, ": key '", where,
                "rope_type' is '", type, "', expected 'mrope' or 'default' (hint: frequency "
                "scaling of the rotary embedding is not supported)");
      return;
    }
  }
}

}  // namespace

std::string family_name(Family f) { return f == Family::qwen2_vl ? "qwen2_vl" : "qwen2_5_vl"; }

VlmConfig parse_hf_config(const std::string& json_text, const std::string& src) {
  json top;
  try {
    top = json::parse(json_text);
  } catch (const std::exception& e) {
    throw Error(str(src, ": not valid JSON: ", e.what()));
  }
  VLM_CHECK(top.is_object(), src, ": expected a JSON object at the top level");
  VlmConfig c;
  const auto model_type = get_req<std::string>(top, "model_type", "", src);
  if (model_type == "qwen2_vl") {
    c.family = Family::qwen2_vl;
  } else if (model_type == "qwen2_5_vl") {
    c.family = Family::qwen2_5_vl;
  } else {
    throw Error(str(src, ": model_type is '", model_type,
                    "', expected 'qwen2_vl' or 'qwen2_5_vl' (hint: only Qwen2-VL and Qwen2.5-VL "
                    "are supported)"));
  }

  // Absent keys take the defaults of transformers 5.23's Qwen2VLConfig / Qwen2_5_VLConfig
  // (and their vision and text sub-configs), so that a stripped config.json means what it
  // means to HF (tests/vlm/config_test.cpp has transformers parse the same files). Those
  // defaults describe the 7B/72B models, not a small one: a config missing its sizes loads
  // as HF would load it, and then fails on the checkpoint's shapes.
  const json empty = json::object();

  // Vision tower: `vision_config` (absent: all defaults). HF reads `in_channels`; the
  // `in_chans` of hub configs is not a key it knows (ignored there, ignored here).
  auto vit = top.find("vision_config");
  VLM_CHECK(vit == top.end() || vit->is_null() || vit->is_object(), src,
            ": key 'vision_config' must be an object, found a JSON ", vit->type_name());
  const json& vj = vit != top.end() && vit->is_object() ? *vit : empty;
  const std::string vw = "vision_config.";
  VisionConfig& v = c.vision;
  const bool v2 = c.family == Family::qwen2_vl;
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
            "', expected '", want_act, "' for ", model_type);

  // Text decoder: `text_config` when present (then, as in HF, the top-level text keys are
  // not read at all), else the top level (the legacy layout).
  auto tit = top.find("text_config");
  const bool nested = tit != top.end() && tit->is_object();
  const json& tj = nested ? *tit : top;
  const std::string tw = nested ? "text_config." : "";
  TextConfig& t = c.text;
  auto ti = [&](const char* key, int64_t dflt) { return get_opt<int64_t>(tj, key, dflt, tw, src); };
  t.vocab_size = ti("vocab_size", 152064);
  t.hidden_size = ti("hidden_size", 8192);
  t.intermediate_size = ti("intermediate_size", 29568);
  t.num_hidden_layers = ti("num_hidden_layers", 80);
  t.num_attention_heads = ti("num_attention_heads", 64);
  // HF: 8 when absent, num_attention_heads when written as null.
  t.num_key_value_heads = tj.contains("num_key_value_heads") && tj["num_key_value_heads"].is_null()
                              ? t.num_attention_heads
                              : ti("num_key_value_heads", 8);
  t.rms_norm_eps = get_opt<double>(tj, "rms_norm_eps", 1e-5, tw, src);
  if (auto p = tj.find("pad_token_id"); p != tj.end() && !p->is_null())
    t.pad_token_id = integer_value(*p, tw + "pad_token_id", src);
  t.rope_theta = get_opt<double>(tj, "rope_theta", 1e6, tw, src);
  t.max_position_embeddings = ti("max_position_embeddings", 32768);
  t.hidden_act = get_opt<std::string>(tj, "hidden_act", "silu", tw, src);
  VLM_CHECK(t.hidden_act == "silu", src, ": text hidden_act is '", t.hidden_act, "', expected 'silu'");
  // Sliding-window attention (layers >= max_window_layers when use_sliding_window) is not
  // implemented: refuse rather than attend over the full sequence where HF would not.
  if (get_opt<bool>(tj, "use_sliding_window", false, tw, src)) {
    const int64_t mwl = ti("max_window_layers", 80);
    VLM_CHECK(mwl >= t.num_hidden_layers, src, ": ", tw, "use_sliding_window is true with ",
              tw, "max_window_layers ", mwl, " < num_hidden_layers ", t.num_hidden_layers,
              ": sliding-window attention is not supported (hint: every released Qwen2-VL / "
              "Qwen2.5-VL config has use_sliding_window false)");
  }
  parse_rope(tj, empty, t, src);

  // Tied head: the top-level key (default false), or true in text_config (HF turns the
  // top-level flag on when the text config has it on).
  c.tie_word_embeddings = get_opt<bool>(top, "tie_word_embeddings", false, "", src) ||
                          (nested && get_opt<bool>(tj, "tie_word_embeddings", false, tw, src));
  c.image_token_id = get_opt<int64_t>(top, "image_token_id", 151655, "", src);
  c.video_token_id = get_opt<int64_t>(top, "video_token_id", 151656, "", src);
  c.vision_start_token_id = get_opt<int64_t>(top, "vision_start_token_id", 151652, "", src);
  c.vision_end_token_id = get_opt<int64_t>(top, "vision_end_token_id", 151653, "", src);
  c.bos_token_id = get_opt<int64_t>(tj, "bos_token_id", 151643, tw, src);
  // eos_token_id: an integer or a list (the first is kept; generation reads its stop ids
  // from generation_config.json and the tokenizer).
  auto eit = tj.find("eos_token_id");
  if (eit == tj.end() || eit->is_null()) {
    c.eos_token_id = 151645;
  } else if (eit->is_array() && !eit->empty()) {
    c.eos_token_id = integer_value((*eit)[0], tw + "eos_token_id[0]", src);
  } else {
    c.eos_token_id = integer_value(*eit, tw + "eos_token_id", src);
  }
  c.torch_dtype = get_opt<std::string>(top, "torch_dtype", get_opt<std::string>(top, "dtype", "bfloat16", "", src), "", src);
  validate(c, src);
  return c;
}

VlmConfig load_hf_config(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  std::string path = dir_or_file;
  if (fs::is_directory(path)) path = (fs::path(path) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in.good(), "cannot read HF config '", path,
            "' (hint: pass an HF model directory containing config.json, or the file itself)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hf_config(ss.str(), path);
}

void validate(const VlmConfig& c, const std::string& src) {
  const auto& v = c.vision;
  const auto& t = c.text;
  // Bounds first, so that no product or sum below (or in the model) can overflow.
  auto in_range = [&](const char* key, int64_t value, int64_t hi) {
    VLM_CHECK(value >= 1 && value <= hi, src, ": ", key, " is ", value, ", expected an integer in [1, ",
              hi, "]");
  };
  in_range("vision_config.depth", v.depth, kMaxConfigLayers);
  in_range("vision_config.num_heads", v.num_heads, kMaxConfigSize);
  in_range("vision_config.embed_dim (ViT width)", v.embed_dim, kMaxConfigSize);
  in_range("vision_config.intermediate_size (ViT MLP width)", v.intermediate_size, kMaxConfigSize);
  in_range("vision merger output width", v.out_hidden_size, kMaxConfigSize);
  in_range("vision_config.patch_size", v.patch_size, kMaxPatchGeometry);
  in_range("vision_config.temporal_patch_size", v.temporal_patch_size, kMaxPatchGeometry);
  in_range("vision_config.spatial_merge_size", v.spatial_merge_size, kMaxPatchGeometry);
  in_range("vision_config.in_channels", v.in_chans, kMaxPatchGeometry);
  in_range("vocab_size", t.vocab_size, kMaxConfigSize);
  in_range("hidden_size", t.hidden_size, kMaxConfigSize);
  in_range("intermediate_size", t.intermediate_size, kMaxConfigSize);
  in_range("num_hidden_layers", t.num_hidden_layers, kMaxConfigLayers);
  in_range("num_attention_heads", t.num_attention_heads, kMaxConfigSize);
  in_range("num_key_value_heads", t.num_key_value_heads, kMaxConfigSize);
  in_range("max_position_embeddings", t.max_position_embeddings, int64_t(1) << 40);
  VLM_CHECK(std::isfinite(t.rope_theta) && t.rope_theta > 0, src, ": rope_theta is ", t.rope_theta,
            ", expected a positive number");
  VLM_CHECK(std::isfinite(t.rms_norm_eps) && t.rms_norm_eps > 0, src, ": rms_norm_eps is ",
            t.rms_norm_eps, ", expected a positive number");
  VLM_CHECK(std::isfinite(v.tokens_per_second) && v.tokens_per_second > 0, src,
            ": vision_config.tokens_per_second is ", v.tokens_per_second, ", expected a positive number");
  for (int64_t s : t.mrope_section)
    VLM_CHECK(s >= 0 && s <= t.hidden_size, src, ": mrope_section entry ", s, " outside [0, ",
              t.hidden_size, "]");
  VLM_CHECK(v.embed_dim % v.num_heads == 0 && v.head_dim() % 4 == 0, src,
            ": vision head_dim = ", v.embed_dim, "/", v.num_heads,
            " must be an integer divisible by 4 (2D rotary: row and column halves)");
  VLM_CHECK(t.vocab_size > 0 && t.hidden_size > 0 && t.num_hidden_layers > 0 &&
                t.num_attention_heads > 0 && t.num_key_value_heads > 0 && t.intermediate_size > 0,
            src, ": text sizes must be positive");
  VLM_CHECK(t.hidden_size % t.num_attention_heads == 0, src, ": text hidden_size ", t.hidden_size,
            " is not divisible by num_attention_heads ", t.num_attention_heads);
  VLM_CHECK(t.num_attention_heads % t.num_key_value_heads == 0, src, ": num_attention_heads ",
            t.num_attention_heads, " is not a multiple of num_key_value_heads ", t.num_key_value_heads);
  const int64_t sec = std::accumulate(t.mrope_section.begin(), t.mrope_section.end(), int64_t{0});
  VLM_CHECK(t.mrope_section.size() == 3 && sec * 2 == t.head_dim(), src,
            ": mrope_section must have 3 entries summing to head_dim/2 = ", t.head_dim() / 2,
            ", got ", t.mrope_section.size(), " entries summing to ", sec);
  VLM_CHECK(v.out_hidden_size == t.hidden_size, src, ": merger output width ", v.out_hidden_size,
            " != text hidden_size ", t.hidden_size,
            " (hint: Qwen2-VL's vision_config.hidden_size is the merger output width)");
  if (c.family == Family::qwen2_5_vl) {
    const int64_t unit = v.spatial_merge_size * v.patch_size;  // >= 1: both bounded above
    VLM_CHECK(v.window_size >= unit && v.window_size <= kMaxConfigSize && v.window_size % unit == 0,
              src, ": vision window_size ",
              v.window_size, " must be a positive multiple of patch_size*spatial_merge_size = ", unit);
    // Entries >= depth name no block (a model cut to fewer blocks), as in HF: ignored.
    for (int64_t b : v.fullatt_block_indexes)
      VLM_CHECK(b >= 0, src, ": fullatt_block_indexes entry ", b, " is negative");
  }
  for (int64_t id : {c.image_token_id, c.vision_start_token_id, c.vision_end_token_id})
    VLM_CHECK(id >= 0 && id < t.vocab_size, src, ": special token id ", id, " outside vocab [0, ",
              t.vocab_size, ")");
}

nlohmann::json to_hf_json(const VlmConfig& c) {
  json j;
  const bool v2 = c.family == Family::qwen2_vl;
  j["model_type"] = family_name(c.family);
  j["architectures"] = {v2 ? "Qwen2VLForConditionalGeneration" : "Qwen2_5_VLForConditionalGeneration"};
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
    vj["tokens_per_second"] = v.tokens_per_second;
  }
  j["vision_config"] = vj;
  return j;
}

namespace {

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
  // Top of the vocab; the trainer overwrites these from the tokenizer it trains.
  c.bos_token_id = 2041;
  c.eos_token_id = 2043;
  c.vision_start_token_id = 2044;
  c.vision_end_token_id = 2045;
  c.image_token_id = 2046;
  c.video_token_id = 2047;
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
  c.bos_token_id = 8185;
  c.eos_token_id = 8187;
  c.vision_start_token_id = 8188;
  c.vision_end_token_id = 8189;
  c.image_token_id = 8190;
  c.video_token_id = 8191;
  return c;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny", "tiny-qwen2.5", "small", "qwen2-vl-2b", "qwen2-vl-7b", "qwen2.5-vl-3b", "qwen2.5-vl-7b"};
}

VlmConfig preset(const std::string& name) {
  VlmConfig c;
  if (name == "tiny") {
    c = tiny(Family::qwen2_vl);
  } else if (name == "tiny-qwen2.5") {
    c = tiny(Family::qwen2_5_vl);
  } else if (name == "small") {
    c = small();
  } else if (name == "qwen2-vl-2b") {
    c = real_qwen2_vl(1536, 8960, 28, 12, 2, 151936, true);
  } else if (name == "qwen2-vl-7b") {
    c = real_qwen2_vl(3584, 18944, 28, 28, 4, 152064, false);
  } else if (name == "qwen2.5-vl-3b") {
    c = real_qwen2_5_vl(2048, 11008, 36, 16, 2, 151936, true);
  } else if (name == "qwen2.5-vl-7b") {
    c = real_qwen2_5_vl(3584, 18944, 28, 28, 4, 152064, false);
  } else {
    std::string all;
    for (const auto& n : preset_names()) all += (all.empty() ? "" : ", ") + n;
    throw Error(str("unknown model preset '", name, "' (expected one of: ", all, ")"));
  }
  validate(c, "preset " + name);
  return c;
}

}  // namespace vlm
