// Registry entry of Qwen3-VL-MoE (30B-A3B, 235B-A22B): Qwen3-VL (its tower, features and key
// table: qwen3_vl.h) whose decoder layers are sparse (vlm/model/moe.h) where HF's rule says so
// (num_experts > 0, (i + 1) % decoder_sparse_step == 0, i not in mlp_only_layers), with
// Qwen3VLMoeTextConfig's defaults for absent keys.
#include <vector>

#include "vlm/runtime/check.h"
#include "vlm/families/config_json.h"
#include "vlm/families/qwen3_vision.h"
#include "vlm/families/qwen3_vl.h"
#include "vlm/families/registry.h"

namespace vlm::qwen3_vl_moe {
namespace {

using namespace config_json;

// Qwen3VLMoeTextConfig's defaults (hidden, intermediate, layers, heads, kv heads, head_dim:
// None, i.e. hidden / heads).
constexpr TextDefaults kMoeText{2048, 5632, 24, 16, 16, 0};

// The keys beyond Qwen3-VL's, in text_config, with their class defaults.
template <class W, class T>
void qwen3_vl_moe_keys(W& text, T& t) {
  moe_text_keys(text, t, /*experts=*/60, /*top_k=*/4, /*expert_width=*/1408);
  text("decoder_sparse_step", t.decoder_sparse_step, 1);
  text("mlp_only_layers", t.mlp_only_layers, std::vector<int64_t>{});
}

VlmConfig parse(const json& top, const std::string& src) {
  VlmConfig c = qwen3_vl::parse(top, src, kMoeText);
  KeyReader r(object_or_empty(top, "text_config", src), "text_config.", src);
  qwen3_vl_moe_keys(r, c.text);
  // HF maps num_experts onto num_local_experts (attribute_map) and saves it under that name.
  c.text.num_experts = get_opt<int64_t>(object_or_empty(top, "text_config", src), "num_local_experts",
                                        c.text.num_experts, "text_config.", src);
  return c;
}

json to_json(const VlmConfig& c) {
  json j = qwen3_vl::to_json(c, kMoeText);
  KeyWriter w(j["text_config"]);
  qwen3_vl_moe_keys(w, c.text);
  j["model_type"] = "qwen3_vl_moe";
  j["architectures"] = {"Qwen3VLMoeForConditionalGeneration"};
  j["text_config"]["model_type"] = "qwen3_vl_moe_text";
  j["vision_config"]["model_type"] = "qwen3_vl_moe_vision";
  return j;
}

void validate(const VlmConfig& c, const std::string& src) {
  qwen3_vl::validate(c, src);
  VLM_CHECK(c.text.num_experts > 0, src, ": text_config.num_experts is ", c.text.num_experts,
            ", expected > 0 for qwen3_vl_moe (hint: a dense Qwen3-VL config has model_type 'qwen3_vl')");
  VLM_CHECK(c.text.shared_expert_intermediate_size == 0, src, ": qwen3_vl_moe has no shared expert");
}

// The published text geometry (Qwen3 30B-A3B / 235B-A22B as torchtitan 0.3.0 registers it:
// every layer sparse, head_dim 128, 4 kv heads) on the 27 x 1152 tower, untied head.
VlmConfig real_moe(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t experts, int64_t top_k,
                   int64_t expert_width) {
  VlmConfig c = qwen3_vl::real(hidden, inter, layers, heads, /*tie=*/false, /*large_vit=*/true);
  c.text.num_key_value_heads = 4;
  c.text.num_experts = experts;
  c.text.num_experts_per_tok = top_k;
  c.text.moe_intermediate_size = expert_width;
  return c;
}

// tiny-qwen3 with 8 experts of width 128, top-2, layer 0 dense (mlp_only_layers) so that
// both kinds of layer run.
VlmConfig tiny_qwen3_moe() {
  VlmConfig c = preset("tiny-qwen3");
  c.text.num_experts = 8;
  c.text.num_experts_per_tok = 2;
  c.text.moe_intermediate_size = 128;
  c.text.mlp_only_layers = {0};
  return c;
}

}  // namespace
}  // namespace vlm::qwen3_vl_moe

namespace vlm {

const ModelFamilySpec& qwen3_vl_family();  // qwen3_vl.cpp (not through the registry: it is being built)

const ModelFamilySpec& qwen3_vl_moe_family() {
  static const ModelFamilySpec spec = [] {
    ModelFamilySpec s = qwen3_vl_family();  // processor, chat, names and tower as Qwen3-VL
    s.model_type = "qwen3_vl_moe";
    s.architecture = "Qwen3VLMoeForConditionalGeneration";
    s.display_name = "Qwen3-VL-MoE";
    s.parse = qwen3_vl_moe::parse;
    s.to_json = qwen3_vl_moe::to_json;
    s.validate = qwen3_vl_moe::validate;
    //                                          hidden  inter layers heads  E   k  width
    s.presets = {{"tiny-qwen3-moe", qwen3_vl_moe::tiny_qwen3_moe},
                 {"qwen3-vl-30b-a3b", [] { return qwen3_vl_moe::real_moe(2048, 6144, 48, 32, 128, 8, 768); }},
                 {"qwen3-vl-235b-a22b", [] { return qwen3_vl_moe::real_moe(4096, 12288, 94, 64, 128, 8, 1536); }}};
    return s;
  }();
  return spec;
}

}  // namespace vlm
