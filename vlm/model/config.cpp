#include "vlm/model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "vlm/runtime/check.h"
#include "vlm/families/config_json.h"
#include "vlm/families/registry.h"

namespace vlm {

int64_t TextConfig::count_layers(MixerKind kind) const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_hidden_layers; ++i) n += mixer(i) == kind ? 1 : 0;
  return n;
}

bool TextConfig::sparse_layer(int64_t layer) const {
  if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t TextConfig::count_sparse_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_hidden_layers; ++i) n += sparse_layer(i) ? 1 : 0;
  return n;
}

std::string family_name(const std::string& family) { return family_spec(family).model_type; }

std::vector<std::string> family_names() {
  std::vector<std::string> out;
  for (const ModelFamilySpec* f : model_families()) out.push_back(f->model_type);
  return out;
}

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
  if (fam == nullptr) {
    std::string names;  // "A, B and C"
    const auto& all = model_families();
    for (size_t i = 0; i < all.size(); ++i)
      names += (i == 0 ? "" : i + 1 == all.size() ? " and " : ", ") + all[i]->display_name;
    throw Error(str(src, ": model_type is '", model_type, "', expected one of ", known_model_types(),
                    " (hint: vlmtrain supports the ", names, " families)"));
  }
  VlmConfig c = fam->parse(top, src);
  c.family = fam->model_type;
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

namespace {

// layer_types (one per layer) and, when a layer is linear attention, its geometry.
void validate_layer_types(const TextConfig& t, const std::string& src) {
  VLM_CHECK(t.layer_types.empty() || static_cast<int64_t>(t.layer_types.size()) == t.num_hidden_layers, src,
            ": layer_types has ", t.layer_types.size(), " entries, expected num_hidden_layers = ",
            t.num_hidden_layers);
  if (t.count_layers(MixerKind::linear_attention) == 0) return;
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"linear_num_key_heads", t.linear_num_key_heads},
                                   {"linear_num_value_heads", t.linear_num_value_heads},
                                   {"linear_key_head_dim", t.linear_key_head_dim},
                                   {"linear_value_head_dim", t.linear_value_head_dim},
                                   {"linear_conv_kernel_dim", t.linear_conv_kernel_dim}})
    VLM_CHECK(value >= 1 && value <= kMaxConfigSize, src, ": ", key, " is ", value, ", expected an integer in [1, ",
              kMaxConfigSize, "] (the config has linear_attention layers)");
  VLM_CHECK(t.linear_num_value_heads % t.linear_num_key_heads == 0, src, ": linear_num_value_heads ",
            t.linear_num_value_heads, " is not a multiple of linear_num_key_heads ", t.linear_num_key_heads);
}

}  // namespace

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
  // Every layer sparse (Qwen3.5-MoE): no dense MLP, intermediate_size unused.
  const bool dense_mlp = t.count_sparse_layers() < t.num_hidden_layers;
  VLM_CHECK(t.num_experts >= 0 && (t.num_experts > 0 || t.intermediate_size != 0), src, ": num_experts is ",
            t.num_experts, " and intermediate_size is ", t.intermediate_size,
            ": no MLP (hint: a mixture-of-experts config needs num_experts > 0, a dense one intermediate_size)");
  if (dense_mlp) in_range("intermediate_size", t.intermediate_size, kMaxConfigSize);
  if (t.num_experts > 0) {
    in_range("num_experts", t.num_experts, kMaxConfigSize);
    in_range("moe_intermediate_size", t.moe_intermediate_size, kMaxConfigSize);
    VLM_CHECK(t.num_experts_per_tok >= 1 && t.num_experts_per_tok <= t.num_experts, src,
              ": num_experts_per_tok is ", t.num_experts_per_tok, ", expected an integer in [1, num_experts = ",
              t.num_experts, "]");
    VLM_CHECK(t.shared_expert_intermediate_size >= 0 && t.shared_expert_intermediate_size <= kMaxConfigSize, src,
              ": shared_expert_intermediate_size is ", t.shared_expert_intermediate_size, ", expected [0, ",
              kMaxConfigSize, "]");
    VLM_CHECK(t.decoder_sparse_step >= 1, src, ": decoder_sparse_step is ", t.decoder_sparse_step,
              ", expected >= 1");
    VLM_CHECK(std::isfinite(t.router_aux_loss_coef) && t.router_aux_loss_coef >= 0, src,
              ": router_aux_loss_coef is ", t.router_aux_loss_coef, ", expected a number >= 0");
  }
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
                t.num_attention_heads > 0 && t.num_key_value_heads > 0 && (t.intermediate_size > 0 || !dense_mlp),
            src, ": text sizes must be positive");
  VLM_CHECK(t.explicit_head_dim >= 0 && t.explicit_head_dim <= kMaxConfigSize, src, ": head_dim is ",
            t.explicit_head_dim, ", expected an integer in [1, ", kMaxConfigSize, "]");
  VLM_CHECK(t.explicit_head_dim > 0 || t.hidden_size % t.num_attention_heads == 0, src,
            ": text hidden_size ", t.hidden_size, " is not divisible by num_attention_heads ",
            t.num_attention_heads, " (hint: or give head_dim)");
  VLM_CHECK(t.num_attention_heads % t.num_key_value_heads == 0, src, ": num_attention_heads ",
            t.num_attention_heads, " is not a multiple of num_key_value_heads ", t.num_key_value_heads);
  VLM_CHECK(std::isfinite(t.partial_rotary_factor) && t.partial_rotary_factor > 0 && t.partial_rotary_factor <= 1,
            src, ": partial_rotary_factor is ", t.partial_rotary_factor, ", expected a number in (0, 1]");
  VLM_CHECK(t.rotary_dim() % 2 == 0, src, ": the rotated dims head_dim * partial_rotary_factor = ",
            t.rotary_dim(), " must be even");
  const int64_t sec = std::accumulate(t.mrope_section.begin(), t.mrope_section.end(), int64_t{0});
  VLM_CHECK(t.mrope_section.size() == 3 && sec * 2 == t.rotary_dim(), src,
            ": mrope_section must have 3 entries summing to half the rotated dims (head_dim * "
            "partial_rotary_factor / 2 = ", t.rotary_dim() / 2, "), got ", t.mrope_section.size(),
            " entries summing to ", sec);
  validate_layer_types(t, src);
  VLM_CHECK(v.out_hidden_size == t.hidden_size, src, ": merger output width ", v.out_hidden_size,
            " != text hidden_size ", t.hidden_size,
            " (hint: Qwen2-VL's vision_config.hidden_size is the merger output width)");
  for (int64_t id : {c.image_token_id, c.vision_start_token_id, c.vision_end_token_id})
    VLM_CHECK(id >= 0 && id < t.vocab_size, src, ": special token id ", id, " outside vocab [0, ",
              t.vocab_size, ")");
  const ModelFamilySpec& fam = family_spec(c.family);
  if (fam.validate) fam.validate(c, src);
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
      c.family = f->model_type;
      validate(c, "preset " + name);
      return c;
    }
  }
  std::string all;
  for (const auto& n : preset_names()) all += (all.empty() ? "" : ", ") + n;
  throw Error(str("unknown model preset '", name, "' (expected one of: ", all, ")"));
}

}  // namespace vlm
