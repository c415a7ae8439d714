// Registry entry of Qwen3.5-MoE (35B-A3B, 122B-A10B, 397B-A17B; Qwen3.6 / 3.8 MoE reuse it):
// Qwen3.5's hybrid decoder (qwen3_5.h) with every layer's `mlp` sparse (vlm/model/moe.h) plus
// a shared expert scaled by sigmoid(shared_expert_gate x); no dense MLP, so no
// intermediate_size. Absent keys take Qwen3_5MoeTextConfig's defaults.
#include "vlm/runtime/check.h"
#include "vlm/families/config_json.h"
#include "vlm/families/qwen3_5.h"
#include "vlm/families/registry.h"

namespace vlm::qwen3_5_moe {
namespace {

using namespace config_json;

// Qwen3_5MoeTextConfig's defaults (hidden, -, layers, heads, kv heads): no intermediate_size.
constexpr TextDefaults kMoeText{2048, 0, 40, 16, 2, 256};

template <class W, class T>
void qwen3_5_moe_keys(W& text, T& t) {
  moe_text_keys(text, t, /*experts=*/256, /*top_k=*/8, /*expert_width=*/512);
  text("shared_expert_intermediate_size", t.shared_expert_intermediate_size, 512);
}

VlmConfig parse(const json& top, const std::string& src) {
  VlmConfig c = qwen3_5::parse(top, src, kMoeText);
  KeyReader r(object_or_empty(top, "text_config", src), "text_config.", src);
  qwen3_5_moe_keys(r, c.text);
  c.text.intermediate_size = 0;
  c.text.decoder_sparse_step = 1;  // every layer sparse (the class has no such key)
  c.text.mlp_only_layers.clear();
  return c;
}

json to_json(const VlmConfig& c) {
  json j = qwen3_5::to_json(c, kMoeText);
  KeyWriter w(j["text_config"]);
  qwen3_5_moe_keys(w, c.text);
  j["model_type"] = "qwen3_5_moe";
  j["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
  j["text_config"]["model_type"] = "qwen3_5_moe_text";
  j["vision_config"]["model_type"] = "qwen3_5_moe_vision";
  return j;
}

void validate(const VlmConfig& c, const std::string& src) {
  qwen3_5::validate(c, src);
  const auto& t = c.text;
  VLM_CHECK(t.num_experts > 0 && t.count_sparse_layers() == t.num_hidden_layers, src,
            ": qwen3_5_moe needs num_experts > 0 and every layer sparse, got num_experts ", t.num_experts, " and ",
            t.count_sparse_layers(), " sparse layers of ", t.num_hidden_layers);
  VLM_CHECK(t.shared_expert_intermediate_size > 0, src,
            ": text_config.shared_expert_intermediate_size must be > 0 for qwen3_5_moe");
}

// The published geometry (torchtitan 0.3.0's Qwen3.5 MoE configs): hidden / layers / query
// heads (2 kv heads of 256) / linear value heads (16 key heads) / experts / top-k / expert and
// shared-expert width, the 27 x 1152 tower, untied head.
VlmConfig real_moe(int64_t hidden, int64_t layers, int64_t heads, int64_t lin_v_heads, int64_t experts,
                   int64_t top_k, int64_t width) {
  VlmConfig c = qwen3_5::real({hidden, layers, heads, 2, 0, 16, lin_v_heads, 1152, 27, 4304, 16, false});
  c.text.num_experts = experts;
  c.text.num_experts_per_tok = top_k;
  c.text.moe_intermediate_size = width;
  c.text.shared_expert_intermediate_size = width;
  return c;
}

// tiny-qwen3.5 with 8 experts of width 128 (top-2) and a shared expert of 128 in every layer.
VlmConfig tiny_qwen3_5_moe() {
  VlmConfig c = preset("tiny-qwen3.5");
  c.text.intermediate_size = 0;
  c.text.num_experts = 8;
  c.text.num_experts_per_tok = 2;
  c.text.moe_intermediate_size = 128;
  c.text.shared_expert_intermediate_size = 128;
  return c;
}

}  // namespace
}  // namespace vlm::qwen3_5_moe

namespace vlm {

const ModelFamilySpec& qwen3_5_family();  // qwen3_5.cpp (not through the registry: it is being built)

const ModelFamilySpec& qwen3_5_moe_family() {
  static const ModelFamilySpec spec = [] {
    ModelFamilySpec s = qwen3_5_family();  // processor, chat, names and tower as Qwen3.5
    s.model_type = "qwen3_5_moe";
    s.architecture = "Qwen3_5MoeForConditionalGeneration";
    s.display_name = "Qwen3.5-MoE";
    s.parse = qwen3_5_moe::parse;
    s.to_json = qwen3_5_moe::to_json;
    s.validate = qwen3_5_moe::validate;
    //                                             hidden layers heads lin-v  E    k  width
    s.presets = {{"tiny-qwen3.5-moe", qwen3_5_moe::tiny_qwen3_5_moe},
                 {"qwen3.5-35b-a3b", [] { return qwen3_5_moe::real_moe(2048, 40, 16, 32, 256, 8, 512); }},
                 {"qwen3.5-122b-a10b", [] { return qwen3_5_moe::real_moe(3072, 48, 32, 64, 256, 8, 1024); }},
                 {"qwen3.5-397b-a17b", [] { return qwen3_5_moe::real_moe(4096, 60, 32, 64, 512, 10, 1024); }}};
    return s;
  }();
  return spec;
}

}  // namespace vlm
