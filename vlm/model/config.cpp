#include "vlm/model/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "vlm/runtime/check.h"
#include "vlm/families/config_json.h"
#include "vlm/families/registry.h"

namespace vlm {

namespace config_json {

void parse_rope(const json& text, TextConfig& t, const std::string& where0, const std::string& src) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {  // HF: rope_scaling wins
    auto it = text.find(key);
    if (it == text.end() || !it->is_object()) continue;
    const std::string where = where0 + key + ".";
    if (it->contains("mrope_section"))
      t.mrope_section = get_req<std::vector<int64_t>>(*it, "mrope_section", where, src);
    if (it->contains("rope_theta")) t.rope_theta = get_req<double>(*it, "rope_theta", where, src);
    t.mrope_interleaved = get_opt<bool>(*it, "mrope_interleaved", t.mrope_interleaved, where, src);
    std::string type = get_opt<std::string>(*it, "rope_type", "", where, src);
    if (type.empty()) type = get_opt<std::string>(*it, "type", "", where, src);
    VLM_CHECK(type.empty() || type == "mrope" || type == "default", src, ": key '", where,
              "rope_type' is '", type, "', expected 'mrope' or 'default' (hint: frequency "
              "scaling of the rotary embedding is not supported)");
    return;
  }
}

void parse_text_common(const json& tj, const std::string& tw, const TextDefaults& d, TextConfig& t,
                       const std::string& src) {
  auto ti = [&](const char* key, int64_t dflt) { return get_opt<int64_t>(tj, key, dflt, tw, src); };
  t.vocab_size = ti("vocab_size", d.vocab_size);
  t.hidden_size = ti("hidden_size", d.hidden_size);
  t.intermediate_size = ti("intermediate_size", d.intermediate_size);
  t.num_hidden_layers = ti("num_hidden_layers", d.num_hidden_layers);
  t.num_attention_heads = ti("num_attention_heads", d.num_attention_heads);
  // HF: the class default when absent, num_attention_heads when written as null.
  t.num_key_value_heads = tj.contains("num_key_value_heads") && tj["num_key_value_heads"].is_null()
                              ? t.num_attention_heads
                              : ti("num_key_value_heads", d.num_key_value_heads);
  t.rms_norm_eps = get_opt<double>(tj, "rms_norm_eps", d.rms_norm_eps, tw, src);
  if (auto p = tj.find("pad_token_id"); p != tj.end() && !p->is_null())
    t.pad_token_id = integer_value(*p, tw + "pad_token_id", src);
  t.rope_theta = get_opt<double>(tj, "rope_theta", d.rope_theta, tw, src);
  t.max_position_embeddings = ti("max_position_embeddings", d.max_position_embeddings);
  t.hidden_act = get_opt<std::string>(tj, "hidden_act", "silu", tw, src);
  VLM_CHECK(t.hidden_act == "silu", src, ": text hidden_act is '", t.hidden_act, "', expected 'silu'");
  parse_rope(tj, t, tw, src);
}

void parse_top_common(const json& top, const json& tj, const std::string& tw, bool text_tie_counts, VlmConfig& c,
                      const std::string& src) {
  // Tied head: the top-level key (default false), or true in text_config (HF turns the
  // top-level flag on when the text config has it on).
  c.tie_word_embeddings = get_opt<bool>(top, "tie_word_embeddings", false, "", src) ||
                          (text_tie_counts && get_opt<bool>(tj, "tie_word_embeddings", false, tw, src));
  c.image_token_id = get_opt<int64_t>(top, "image_token_id", 151655, "", src);
  c.video_token_id = get_opt<int64_t>(top, "video_token_id", 151656, "", src);
  c.vision_start_token_id = get_opt<int64_t>(top, "vision_start_token_id", 151652, "", src);
  c.vision_end_token_id = get_opt<int64_t>(top, "vision_end_token_id", 151653, "", src);
  c.bos_token_id = get_opt<int64_t>(tj, "bos_token_id", get_opt<int64_t>(top, "bos_token_id", 151643, "", src), tw, src);
  // eos_token_id: an integer or a list (the first is kept; generation reads its stop ids
  // from generation_config.json and the tokenizer).
  const json* eos = nullptr;
  std::string ew = tw;
  for (const json* obj : {&tj, &top}) {
    auto it = obj->find("eos_token_id");
    if (it != obj->end() && !it->is_null()) {
      eos = &*it;
      break;
    }
    ew = "";
  }
  if (eos == nullptr) {
    c.eos_token_id = 151645;
  } else if (eos->is_array() && !eos->empty()) {
    c.eos_token_id = integer_value((*eos)[0], ew + "eos_token_id[0]", src);
  } else {
    c.eos_token_id = integer_value(*eos, ew + "eos_token_id", src);
  }
  const std::string dtype = get_opt<std::string>(tj, "dtype", get_opt<std::string>(top, "dtype", "bfloat16", "", src), tw, src);
  c.torch_dtype = get_opt<std::string>(top, "torch_dtype", dtype, "", src);
}

}  // namespace config_json

std::string family_name(Family f) { return family_spec(f).model_type; }

VlmConfig parse_hf_config(const std::string& json_text, const std::string& src) {
  using config_json::json;
  json top;
  try {
    top = json::parse(json_text);
  } catch (const std::exception& e) {
    throw Error(str(src, ": not valid JSON: ", e.what()));
  }
  VLM_CHECK(top.is_object(), src, ": expected a JSON object at the top level");
  const auto model_type = config_json::get_req<std::string>(top, "model_type", "", src);
  const ModelFamilySpec* fam = find_family(model_type);
  VLM_CHECK(fam != nullptr, src, ": model_type is '", model_type, "', expected one of ", known_model_types(),
            " (hint: vlmtrain supports the Qwen2-VL, Qwen2.5-VL and Qwen3-VL dense families)");
  VlmConfig c = fam->parse(top, src);
  c.family = fam->family;
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
  VLM_CHECK(t.explicit_head_dim >= 0 && t.explicit_head_dim <= kMaxConfigSize, src, ": head_dim is ",
            t.explicit_head_dim, ", expected an integer in [1, ", kMaxConfigSize, "]");
  VLM_CHECK(t.explicit_head_dim > 0 || t.hidden_size % t.num_attention_heads == 0, src,
            ": text hidden_size ", t.hidden_size, " is not divisible by num_attention_heads ",
            t.num_attention_heads, " (hint: or give head_dim)");
  VLM_CHECK(t.num_attention_heads % t.num_key_value_heads == 0, src, ": num_attention_heads ",
            t.num_attention_heads, " is not a multiple of num_key_value_heads ", t.num_key_value_heads);
  const int64_t sec = std::accumulate(t.mrope_section.begin(), t.mrope_section.end(), int64_t{0});
  VLM_CHECK(t.mrope_section.size() == 3 && sec * 2 == t.head_dim(), src,
            ": mrope_section must have 3 entries summing to head_dim/2 = ", t.head_dim() / 2,
            ", got ", t.mrope_section.size(), " entries summing to ", sec);
  VLM_CHECK(v.out_hidden_size == t.hidden_size, src, ": merger output width ", v.out_hidden_size,
            " != text hidden_size ", t.hidden_size,
            " (hint: Qwen2-VL's vision_config.hidden_size is the merger output width)");
  for (int64_t id : {c.image_token_id, c.vision_start_token_id, c.vision_end_token_id})
    VLM_CHECK(id >= 0 && id < t.vocab_size, src, ": special token id ", id, " outside vocab [0, ",
              t.vocab_size, ")");
  if (family_spec(c.family).validate) family_spec(c.family).validate(c, src);
}

nlohmann::json to_hf_json(const VlmConfig& c) { return family_spec(c.family).to_json(c); }

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const ModelFamilySpec* f : model_families())
    for (const auto& p : f->presets) out.push_back(p.first);
  return out;
}

VlmConfig preset(const std::string& name) {
  for (const ModelFamilySpec* f : model_families()) {
    for (const auto& p : f->presets) {
      if (p.first != name) continue;
      VlmConfig c = p.second();
      c.family = f->family;
      validate(c, "preset " + name);
      return c;
    }
  }
  std::string all;
  for (const auto& n : preset_names()) all += (all.empty() ? "" : ", ") + n;
  throw Error(str("unknown model preset '", name, "' (expected one of: ", all, ")"));
}

}  // namespace vlm
