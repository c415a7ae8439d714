// Configs and parameter counts.
// References: the published Qwen2-VL-2B count (REFERENCE.md), and for the other presets a
// closed-form count written out here from the spec's weight list (section 5), independent
// of the module code. Parsing is checked against hand-written config.json texts in both
// layouts (legacy top-level text fields, newer text_config + rope_parameters).
#include <gtest/gtest.h>

#include "vlm/check.h"
#include "vlm/config.h"
#include "vlm/meta_init.h"
#include "vlm/qwen2_vl.h"

namespace {

struct Counts {
  int64_t vision, merger, llm;
};

// Closed form from the spec's weight list.
Counts formula(const vlm::VlmConfig& c) {
  const auto& v = c.vision;
  const auto& t = c.text;
  const bool v2 = c.family == vlm::Family::qwen2_vl;
  const int64_t e = v.embed_dim, i = v.intermediate_size, m = e * 4;
  const int64_t norm = v2 ? 2 * e : e;
  const int64_t mlp = v2 ? (e * i + i) + (i * e + e) : 2 * (e * i + i) + (i * e + e);
  const int64_t block = 2 * norm + (e * 3 * e + 3 * e) + (e * e + e) + mlp;
  const int64_t merger = norm + (m * m + m) + (m * v.out_hidden_size + v.out_hidden_size);
  const int64_t patch = e * 3 * 2 * 14 * 14;
  const int64_t d = t.hidden_size, kv = t.num_key_value_heads * t.head_dim();
  const int64_t layer = 2 * d + (d * d + d) + 2 * (d * kv + kv) + d * d + 3 * d * t.intermediate_size;
  const int64_t emb = t.vocab_size * d;
  const int64_t llm = emb + t.num_hidden_layers * layer + d + (c.tie_word_embeddings ? 0 : emb);
  return {patch + v.depth * block + merger, merger, llm};
}

TEST(Config, Qwen2Vl2bExactPublishedCount) {
  vlm::Qwen2VL m(vlm::preset("qwen2-vl-2b"), torch::TensorOptions().device(torch::kMeta));
  EXPECT_EQ(vlm::count_parameters(*m), 2208985600LL);
  EXPECT_EQ(vlm::count_parameters(*m->visual), 665271296LL);
  EXPECT_EQ(vlm::count_parameters(*m->visual->merger), 34087936LL);
  EXPECT_EQ(vlm::count_parameters(*m->model), 1543714304LL);
  EXPECT_FALSE(m->lm_head);  // tied: no second copy of the embedding
}

TEST(Config, OtherRealPresetsMatchHubTotals) {
  // Parameter totals shown for the hub checkpoints (safetensors metadata on the model
  // pages; quoted from memory, not from shared/REFERENCE.md, so a mismatch means: check the
  // preset shapes AND this figure).
  const std::vector<std::pair<std::string, int64_t>> want{
      {"qwen2-vl-7b", 8291375616LL}, {"qwen2.5-vl-3b", 3754622976LL}, {"qwen2.5-vl-7b", 8292166656LL}};
  for (const auto& [name, n] : want) {
    vlm::Qwen2VL m(vlm::preset(name), torch::TensorOptions().device(torch::kMeta));
    EXPECT_EQ(vlm::count_parameters(*m), n) << name;
  }
}

TEST(Config, EveryPresetMatchesClosedForm) {
  for (const auto& name : vlm::preset_names()) {
    SCOPED_TRACE(name);
    const auto cfg = vlm::preset(name);
    vlm::Qwen2VL m(cfg, torch::TensorOptions().device(torch::kMeta));
    const Counts f = formula(cfg);
    EXPECT_EQ(vlm::count_parameters(*m->visual), f.vision);
    EXPECT_EQ(vlm::count_parameters(*m->visual->merger), f.merger);
    EXPECT_EQ(vlm::count_parameters(*m) - vlm::count_parameters(*m->visual), f.llm);
    EXPECT_TRUE(vlm::has_meta_parameters(*m));
  }
}

TEST(Config, HfNamesOfBothFamilies) {
  vlm::Qwen2VL a(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
  auto pa = a->named_parameters();
  for (const char* n : {"visual.patch_embed.proj.weight", "visual.blocks.0.norm1.bias",
                        "visual.blocks.3.attn.qkv.weight", "visual.blocks.0.attn.proj.bias",
                        "visual.blocks.0.mlp.fc1.weight", "visual.blocks.0.mlp.fc2.bias",
                        "visual.merger.ln_q.bias", "visual.merger.mlp.0.weight", "visual.merger.mlp.2.bias",
                        "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                        "model.layers.1.self_attn.q_proj.bias", "model.layers.0.self_attn.o_proj.weight",
                        "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight",
                        "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
                        "model.norm.weight"})
    EXPECT_TRUE(pa.contains(n)) << n;
  EXPECT_FALSE(pa.contains("lm_head.weight"));
  EXPECT_FALSE(pa.contains("model.layers.0.self_attn.o_proj.bias"));
  EXPECT_EQ(pa["visual.patch_embed.proj.weight"].sizes(), torch::IntArrayRef({128, 3, 2, 14, 14}));

  auto cfg = vlm::preset("tiny-qwen2.5");
  cfg.tie_word_embeddings = false;
  vlm::Qwen2VL b(cfg, torch::TensorOptions().device(torch::kMeta));
  auto pb = b->named_parameters();
  for (const char* n : {"visual.blocks.0.mlp.gate_proj.bias", "visual.blocks.0.mlp.down_proj.weight",
                        "visual.blocks.0.norm1.weight", "visual.merger.ln_q.weight", "lm_head.weight"})
    EXPECT_TRUE(pb.contains(n)) << n;
  EXPECT_FALSE(pb.contains("visual.blocks.0.norm1.bias"));  // RMSNorm
  EXPECT_FALSE(pb.contains("visual.merger.ln_q.bias"));
}

// Abbreviated Qwen2-VL-2B-Instruct config.json (legacy layout).
const char* kQwen2Vl2b = R"({
  "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
  "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
  "num_attention_heads": 12, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "vocab_size": 151936, "tie_word_embeddings": true,
  "vision_start_token_id": 151652, "vision_end_token_id": 151653, "image_token_id": 151655,
  "video_token_id": 151656, "bos_token_id": 151643, "eos_token_id": 151645,
  "torch_dtype": "bfloat16", "max_position_embeddings": 32768,
  "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16,
    "in_chans": 3, "hidden_size": 1536, "patch_size": 14, "spatial_merge_size": 2,
    "spatial_patch_size": 14, "temporal_patch_size": 2},
  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}
})";

// Qwen2.5-VL in the newer layout (text_config, rope_parameters).
const char* kQwen25New = R"({
  "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
  "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
  "vision_end_token_id": 151653, "tie_word_embeddings": true,
  "text_config": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "vocab_size": 151936, "max_position_embeddings": 128000,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}},
  "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
    "out_hidden_size": 2048, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
    "hidden_act": "silu", "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "tokens_per_second": 2, "in_chans": 3}
})";

TEST(Config, ParsesLegacyQwen2VlLayout) {
  auto c = vlm::parse_hf_config(kQwen2Vl2b, "2b.json");
  auto p = vlm::preset("qwen2-vl-2b");
  EXPECT_EQ(c.family, vlm::Family::qwen2_vl);
  EXPECT_EQ(c.vision.embed_dim, 1280);
  EXPECT_EQ(c.vision.out_hidden_size, 1536);  // vision_config.hidden_size = merger output
  EXPECT_EQ(c.vision.intermediate_size, 5120);
  EXPECT_EQ(c.text.hidden_size, p.text.hidden_size);
  EXPECT_EQ(c.text.num_key_value_heads, 2);
  EXPECT_DOUBLE_EQ(c.text.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.text.mrope_section, (std::vector<int64_t>{16, 24, 24}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.image_token_id, 151655);
}

TEST(Config, ParsesNewQwen25Layout) {
  auto c = vlm::parse_hf_config(kQwen25New, "3b.json");
  EXPECT_EQ(c.family, vlm::Family::qwen2_5_vl);
  EXPECT_EQ(c.vision.embed_dim, 1280);  // vision_config.hidden_size = ViT width in 2.5
  EXPECT_EQ(c.vision.out_hidden_size, 2048);
  EXPECT_EQ(c.vision.window_size, 112);
  EXPECT_EQ(c.vision.fullatt_block_indexes, (std::vector<int64_t>{7, 15, 23, 31}));
  EXPECT_EQ(c.text.num_hidden_layers, 36);
  EXPECT_DOUBLE_EQ(c.text.rope_theta, 1e6);
  vlm::Qwen2VL m(c, torch::TensorOptions().device(torch::kMeta));
  vlm::Qwen2VL ref(vlm::preset("qwen2.5-vl-3b"), torch::TensorOptions().device(torch::kMeta));
  EXPECT_EQ(vlm::count_parameters(*m), vlm::count_parameters(*ref));
}

TEST(Config, HfJsonRoundTripsEveryPreset) {
  for (const auto& name : vlm::preset_names()) {
    SCOPED_TRACE(name);
    const auto a = vlm::preset(name);
    const auto b = vlm::parse_hf_config(vlm::to_hf_json(a).dump(), name);
    EXPECT_EQ(vlm::to_hf_json(a), vlm::to_hf_json(b));
    EXPECT_EQ(a.vision.intermediate_size, b.vision.intermediate_size);
    EXPECT_EQ(a.text.mrope_section, b.text.mrope_section);
  }
}

TEST(Config, ErrorsNameSourceAndKey) {
  auto j = nlohmann::json::parse(kQwen2Vl2b);
  j["vision_config"].erase("depth");
  try {
    vlm::parse_hf_config(j.dump(), "my/config.json");
    FAIL() << "no error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("my/config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vision_config.depth"), std::string::npos) << e.what();
  }
  j = nlohmann::json::parse(kQwen2Vl2b);
  j["model_type"] = "llava";
  EXPECT_THROW(vlm::parse_hf_config(j.dump(), "x"), vlm::Error);
  EXPECT_THROW(vlm::preset("qwen3"), vlm::Error);
}

// Regression tests from tests/fuzz/config_json_fuzz.cpp: a config.json from a stranger is
// rejected with a vlm::Error naming the file and the key, never a crash or undefined behaviour.
void expect_config_error(const nlohmann::json& j, const std::string& needle) {
  try {
    vlm::parse_hf_config(j.dump(), "fuzzed/config.json");
    FAIL() << "expected a vlm::Error for " << needle;
  } catch (const vlm::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("fuzzed/config.json"), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

TEST(Config, RejectsZeroOrNegativePatchGeometry) {
  // Was: window_size % (spatial_merge_size * patch_size) divided by zero (SIGFPE).
  for (const char* key : {"patch_size", "spatial_merge_size", "temporal_patch_size", "in_chans"}) {
    for (int64_t bad : {int64_t(0), int64_t(-1), int64_t(1) << 40}) {
      auto j = nlohmann::json::parse(kQwen25New);
      j["vision_config"][key] = bad;
      expect_config_error(j, std::string("vision_config.") + key);
    }
  }
}

TEST(Config, RejectsNonIntegerAndOverflowingNumbers) {
  // Was: nlohmann's float -> int64 cast of 1e300 (undefined behaviour), 2.5 truncated to 2.
  auto j = nlohmann::json::parse(kQwen2Vl2b);
  j["vision_config"]["depth"] = 1e300;
  expect_config_error(j, "'vision_config.depth' must be an integer");
  j = nlohmann::json::parse(kQwen2Vl2b);
  j["num_hidden_layers"] = 2.5;
  expect_config_error(j, "'num_hidden_layers' must be an integer");
  j = nlohmann::json::parse(kQwen2Vl2b);
  j["vocab_size"] = uint64_t(1) << 63;
  expect_config_error(j, "does not fit in int64");
  // Was: int64 cast of embed_dim * mlp_ratio = 1280e300 (undefined behaviour).
  j = nlohmann::json::parse(kQwen2Vl2b);
  j["vision_config"]["mlp_ratio"] = 1e300;
  expect_config_error(j, "mlp_ratio");
  j = nlohmann::json::parse(kQwen2Vl2b);
  j["vision_config"]["mlp_ratio"] = -4.0;
  expect_config_error(j, "mlp_ratio");
  // Was: signed overflow summing the sections.
  j = nlohmann::json::parse(kQwen2Vl2b);
  j["rope_scaling"]["mrope_section"] = {INT64_MAX, INT64_MAX, 1};
  expect_config_error(j, "mrope_section entry");
  j = nlohmann::json::parse(kQwen2Vl2b);
  j["rope_scaling"]["mrope_section"] = {16, 24.5, 24};
  expect_config_error(j, "mrope_section[1]' must be an integer");
  // Sizes whose products would overflow int64 in the model.
  j = nlohmann::json::parse(kQwen2Vl2b);
  j["vocab_size"] = int64_t(1) << 40;
  expect_config_error(j, "vocab_size");
  j = nlohmann::json::parse(kQwen2Vl2b);
  j["rope_theta"] = -1.0;
  expect_config_error(j, "rope_theta");
}

TEST(Config, MaterializeIsDeterministicAndInitialises) {
  auto cfg = vlm::preset("tiny");
  vlm::Qwen2VL a(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::Qwen2VL b(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*a, {torch::kCPU, torch::kFloat32, 7});
  vlm::materialize(*b, {torch::kCPU, torch::kFloat32, 7});
  EXPECT_FALSE(vlm::has_meta_parameters(*a));
  auto pa = a->named_parameters();
  auto pb = b->named_parameters();
  for (const auto& it : pa) EXPECT_TRUE(torch::equal(it.value(), pb[it.key()])) << it.key();
  // Layer members point at the replaced tensors (forward uses them).
  EXPECT_TRUE(a->model->embed_tokens->weight.is_same(pa["model.embed_tokens.weight"]));
  EXPECT_TRUE(torch::all(pa["model.norm.weight"] == 1).item<bool>());
  EXPECT_TRUE(torch::all(pa["visual.blocks.0.attn.qkv.bias"] == 0).item<bool>());
  const auto w = pa["model.layers.0.mlp.up_proj.weight"];
  EXPECT_NEAR(w.std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(w.mean().item<double>(), 0.0, 0.001);
  EXPECT_TRUE(w.requires_grad());
  // Different parameters get different streams.
  EXPECT_FALSE(torch::equal(pa["model.layers.0.mlp.up_proj.weight"], pa["model.layers.1.mlp.up_proj.weight"]));
  vlm::Qwen2VL c(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*c, {torch::kCPU, torch::kFloat32, 8});
  EXPECT_FALSE(torch::equal(pa["model.embed_tokens.weight"], c->named_parameters()["model.embed_tokens.weight"]));
}

}  // namespace
