// Configs and parameter counts.
// References: the published Qwen2-VL-2B count (REFERENCE.md), and for the other presets a
// closed-form count written out here from the spec's weight list (section 5), independent
// of the module code. Parsing is checked against hand-written config.json texts in both
// layouts (legacy top-level text fields, newer text_config + rope_parameters).
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>

#include "tests/testing.h"

#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"

namespace {

struct Counts {
  int64_t vision, merger, llm;
};

// Qwen3-VL's closed form (transformers' modeling_qwen3_vl weight list): patch embedding
// with bias, a num_position_embeddings x E position table, LayerNorm blocks with a 2-layer
// MLP, a merger with a norm over E, DeepStack mergers with a norm over 4E; decoder layers
// with H x head_dim query width, q/k norms over head_dim, no attention biases.
Counts formula_qwen3(const vlm::VlmConfig& c) {
  const auto& v = c.vision;
  const auto& t = c.text;
  const int64_t e = v.embed_dim, i = v.intermediate_size, m = e * 4, o = v.out_hidden_size;
  const int64_t block = 2 * 2 * e + (e * 3 * e + 3 * e) + (e * e + e) + (e * i + i) + (i * e + e);
  const int64_t fc = (m * m + m) + (m * o + o);
  const int64_t merger = 2 * e + fc;
  const int64_t deepstack = static_cast<int64_t>(v.deepstack_visual_indexes.size()) * (2 * m + fc);
  const int64_t patch = e * 3 * 2 * 16 * 16 + e;
  const int64_t pos = v.num_position_embeddings * e;
  const int64_t d = t.hidden_size, hd = t.head_dim(), q = t.num_attention_heads * hd, kv = t.num_key_value_heads * hd;
  const int64_t layer = 2 * d + d * q + 2 * d * kv + q * d + 2 * hd + 3 * d * t.intermediate_size;
  const int64_t emb = t.vocab_size * d;
  const int64_t llm = emb + t.num_hidden_layers * layer + d + (c.tie_word_embeddings ? 0 : emb);
  return {patch + pos + v.depth * block + merger + deepstack, merger + deepstack, llm};
}

// A sparse layer's `mlp` minus the dense MLP it replaces (the MoE families): router E x d,
// fused experts E x 3 x d x I, and the shared expert (3 x d x I_s) with its 1 x d gate.
int64_t moe_minus_dense(const vlm::TextConfig& t) {
  const int64_t d = t.hidden_size, s = t.shared_expert_intermediate_size;
  const int64_t moe = t.num_experts * d + t.num_experts * 3 * d * t.moe_intermediate_size + (s > 0 ? 3 * d * s + d : 0);
  return t.count_sparse_layers() * (moe - 3 * d * t.intermediate_size);
}

// Qwen3.5: the Qwen3-VL tower without DeepStack; gated attention (q_proj twice as wide) in
// the full layers, Gated DeltaNet in the linear ones.
Counts formula_qwen3_5(const vlm::VlmConfig& c) {
  Counts v = formula_qwen3(c);  // vision as Qwen3-VL's (no DeepStack mergers listed)
  const auto& t = c.text;
  const int64_t d = t.hidden_size, hd = t.head_dim(), q = t.num_attention_heads * hd, kv = t.num_key_value_heads * hd;
  const int64_t mlp = 3 * d * t.intermediate_size;
  const int64_t full = 2 * d + d * 2 * q + 2 * d * kv + q * d + 2 * hd + mlp;
  const int64_t h = t.linear_num_value_heads, kd = t.linear_num_key_heads * t.linear_key_head_dim;
  const int64_t vd = h * t.linear_value_head_dim, conv = 2 * kd + vd;
  const int64_t linear = 2 * d + d * conv + d * vd + 2 * d * h + conv * t.linear_conv_kernel_dim + 2 * h +
                         t.linear_value_head_dim + vd * d + mlp;
  const int64_t nf = t.count_layers(vlm::MixerKind::full_attention);
  const int64_t emb = t.vocab_size * d;
  v.llm = emb + nf * full + (t.num_hidden_layers - nf) * linear + d + (c.tie_word_embeddings ? 0 : emb) +
          moe_minus_dense(t);
  return v;
}

// Closed form from the spec's weight list.
Counts formula(const vlm::VlmConfig& c) {
  if (c.family == "qwen3_vl") return formula_qwen3(c);
  if (c.family == "qwen3_5" || c.family == "qwen3_5_moe") return formula_qwen3_5(c);
  if (c.family == "qwen3_vl_moe") {
    Counts f = formula_qwen3(c);
    f.llm += moe_minus_dense(c.text);
    return f;
  }
  const auto& v = c.vision;
  const auto& t = c.text;
  const bool v2 = c.family == "qwen2_vl";
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
  vlm::VisionLanguageModel m(vlm::preset("qwen2-vl-2b"), torch::TensorOptions().device(torch::kMeta));
  EXPECT_EQ(vlm::count_parameters(*m), 2208985600LL);
  EXPECT_EQ(vlm::count_parameters(*m->visual), 665271296LL);
  EXPECT_EQ(m->visual->connector_parameters(), 34087936LL);
  EXPECT_EQ(vlm::count_parameters(*m->model), 1543714304LL);
  EXPECT_FALSE(m->lm_head);  // tied: no second copy of the embedding
}

TEST(Config, OtherRealPresetsMatchHubTotals) {
  // Parameter totals shown for the hub checkpoints (safetensors metadata on the model
  // pages; quoted from memory, not from a file we can check, so a mismatch means: check the
  // preset shapes AND this figure).
  const std::vector<std::pair<std::string, int64_t>> want{
      {"qwen2-vl-7b", 8291375616LL}, {"qwen2.5-vl-3b", 3754622976LL}, {"qwen2.5-vl-7b", 8292166656LL}};
  for (const auto& [name, n] : want) {
    vlm::VisionLanguageModel m(vlm::preset(name), torch::TensorOptions().device(torch::kMeta));
    EXPECT_EQ(vlm::count_parameters(*m), n) << name;
  }
}

TEST(Config, EveryPresetMatchesClosedForm) {
  for (const auto& name : vlm::preset_names()) {
    SCOPED_TRACE(name);
    const auto cfg = vlm::preset(name);
    vlm::VisionLanguageModel m(cfg, torch::TensorOptions().device(torch::kMeta));
    const Counts f = formula(cfg);
    EXPECT_EQ(vlm::count_parameters(*m->visual), f.vision);
    EXPECT_EQ(m->visual->connector_parameters(), f.merger);
    EXPECT_EQ(vlm::count_parameters(*m) - vlm::count_parameters(*m->visual), f.llm);
    EXPECT_TRUE(vlm::has_meta_parameters(*m));
  }
}

TEST(Config, HfNamesOfBothFamilies) {
  vlm::VisionLanguageModel a(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
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
  vlm::VisionLanguageModel b(cfg, torch::TensorOptions().device(torch::kMeta));
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
  EXPECT_EQ(c.family, "qwen2_vl");
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
  EXPECT_EQ(c.family, "qwen2_5_vl");
  EXPECT_EQ(c.vision.embed_dim, 1280);  // vision_config.hidden_size = ViT width in 2.5
  EXPECT_EQ(c.vision.out_hidden_size, 2048);
  EXPECT_EQ(c.vision.window_size, 112);
  EXPECT_EQ(c.vision.fullatt_block_indexes, (std::vector<int64_t>{7, 15, 23, 31}));
  EXPECT_EQ(c.text.num_hidden_layers, 36);
  EXPECT_DOUBLE_EQ(c.text.rope_theta, 1e6);
  vlm::VisionLanguageModel m(c, torch::TensorOptions().device(torch::kMeta));
  vlm::VisionLanguageModel ref(vlm::preset("qwen2.5-vl-3b"), torch::TensorOptions().device(torch::kMeta));
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
  j["vision_config"]["depth"] = "32";  // a string (a missing key takes HF's default)
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
  for (const char* key : {"patch_size", "spatial_merge_size", "temporal_patch_size", "in_channels"}) {
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
  vlm::VisionLanguageModel a(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::VisionLanguageModel b(cfg, torch::TensorOptions().device(torch::kMeta));
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
  vlm::VisionLanguageModel c(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*c, {torch::kCPU, torch::kFloat32, 8});
  EXPECT_FALSE(torch::equal(pa["model.embed_tokens.weight"], c->named_parameters()["model.embed_tokens.weight"]));
}

}  // namespace

// ---------------------------------------------------------------- HF defaults
// Keys missing from config.json: parse_hf_config against transformers at test time.
// scripts/config_reference.py loads every file with AutoConfig.from_pretrained and writes
// the values the HF model is built from; we compare every VlmConfig field exactly (the same
// decimal text parses to the same double on both sides). Files: three bases (Qwen2-VL-2B's
// legacy layout, Qwen2.5-VL in the text_config layout, and a legacy file whose
// text_config disagrees with its top-level keys), each base itself, then each base with
// ONE key removed, for every key at the top level, in text_config, in vision_config and
// in the rope section; plus whole sections removed, num_key_value_heads null, an eos list
// and a tie flag only in text_config. When vlmtrain rejects a file (e.g. removing
// hidden_size leaves HF's default 8192 beside a 1536-wide merger), the values HF resolved
// must fail vlmtrain's validate() as well: the rejection is about the model, not the parsing.
namespace config_hf_test {

using nlohmann::json;

// The VlmConfig that HF's resolved values describe (one row of config_reference.py).
vlm::VlmConfig from_hf(const json& r) {
  vlm::VlmConfig c;
  c.family = r["family"] == "qwen2_vl" ? "qwen2_vl" : "qwen2_5_vl";
  const json& v = r["vision"];
  c.vision.depth = v["depth"];
  c.vision.num_heads = v["num_heads"];
  c.vision.patch_size = v["patch_size"];
  c.vision.temporal_patch_size = v["temporal_patch_size"];
  c.vision.spatial_merge_size = v["spatial_merge_size"];
  c.vision.in_chans = v["in_chans"];
  c.vision.hidden_act = v["hidden_act"];
  c.vision.embed_dim = v["embed_dim"];
  c.vision.out_hidden_size = v["out_hidden_size"];
  c.vision.intermediate_size = v["intermediate_size"];
  if (c.family == "qwen2_5_vl") {
    c.vision.window_size = v["window_size"];
    c.vision.fullatt_block_indexes = v["fullatt_block_indexes"].get<std::vector<int64_t>>();
    c.vision.tokens_per_second = v["tokens_per_second"];
  }
  const json& t = r["text"];
  c.text.vocab_size = t["vocab_size"];
  c.text.hidden_size = t["hidden_size"];
  c.text.intermediate_size = t["intermediate_size"];
  c.text.num_hidden_layers = t["num_hidden_layers"];
  c.text.num_attention_heads = t["num_attention_heads"];
  c.text.num_key_value_heads = t["num_key_value_heads"];
  c.text.rms_norm_eps = t["rms_norm_eps"];
  c.text.rope_theta = t["rope_theta"];
  c.text.mrope_section = t["mrope_section"].get<std::vector<int64_t>>();
  c.text.max_position_embeddings = t["max_position_embeddings"];
  c.text.hidden_act = t["hidden_act"];
  c.tie_word_embeddings = r["tie_word_embeddings"];
  c.image_token_id = r["image_token_id"];
  c.video_token_id = r["video_token_id"];
  c.vision_start_token_id = r["vision_start_token_id"];
  c.vision_end_token_id = r["vision_end_token_id"];
  c.bos_token_id = r["bos_token_id"];
  c.eos_token_id = r["eos_token_id"];
  return c;
}

// Every field that builds the model (torch_dtype aside: HF keeps it apart from the config).
void expect_same(const vlm::VlmConfig& a, const vlm::VlmConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.vision.depth, b.vision.depth);
  EXPECT_EQ(a.vision.num_heads, b.vision.num_heads);
  EXPECT_EQ(a.vision.patch_size, b.vision.patch_size);
  EXPECT_EQ(a.vision.temporal_patch_size, b.vision.temporal_patch_size);
  EXPECT_EQ(a.vision.spatial_merge_size, b.vision.spatial_merge_size);
  EXPECT_EQ(a.vision.in_chans, b.vision.in_chans);
  EXPECT_EQ(a.vision.hidden_act, b.vision.hidden_act);
  EXPECT_EQ(a.vision.embed_dim, b.vision.embed_dim);
  EXPECT_EQ(a.vision.out_hidden_size, b.vision.out_hidden_size);
  EXPECT_EQ(a.vision.intermediate_size, b.vision.intermediate_size);
  if (a.family == "qwen2_5_vl") {
    EXPECT_EQ(a.vision.window_size, b.vision.window_size);
    EXPECT_EQ(a.vision.fullatt_block_indexes, b.vision.fullatt_block_indexes);
    EXPECT_EQ(a.vision.tokens_per_second, b.vision.tokens_per_second);
  }
  EXPECT_EQ(a.text.vocab_size, b.text.vocab_size);
  EXPECT_EQ(a.text.hidden_size, b.text.hidden_size);
  EXPECT_EQ(a.text.intermediate_size, b.text.intermediate_size);
  EXPECT_EQ(a.text.num_hidden_layers, b.text.num_hidden_layers);
  EXPECT_EQ(a.text.num_attention_heads, b.text.num_attention_heads);
  EXPECT_EQ(a.text.num_key_value_heads, b.text.num_key_value_heads);
  EXPECT_EQ(a.text.rms_norm_eps, b.text.rms_norm_eps);
  EXPECT_EQ(a.text.rope_theta, b.text.rope_theta);
  EXPECT_EQ(a.text.mrope_section, b.text.mrope_section);
  EXPECT_EQ(a.text.max_position_embeddings, b.text.max_position_embeddings);
  EXPECT_EQ(a.text.hidden_act, b.text.hidden_act);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.image_token_id, b.image_token_id);
  EXPECT_EQ(a.video_token_id, b.video_token_id);
  EXPECT_EQ(a.vision_start_token_id, b.vision_start_token_id);
  EXPECT_EQ(a.vision_end_token_id, b.vision_end_token_id);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
}

struct Variant {
  std::string name;
  json config;
};

std::vector<Variant> variants() {
  json both = json::parse(kQwen2Vl2b);  // legacy keys AND a text_config that disagrees
  both["text_config"] = {{"hidden_size", 1536}, {"intermediate_size", 8960}, {"num_hidden_layers", 2},
                         {"num_attention_heads", 12}, {"num_key_value_heads", 4}, {"rms_norm_eps", 1e-3},
                         {"vocab_size", 151936}, {"rope_theta", 5000.0},
                         {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {16, 24, 24}}}}};
  json legacy25 = json::parse(kQwen25New);  // Qwen2.5 with top-level text keys, rope_scaling
  for (auto& [k, val] : legacy25["text_config"].items()) legacy25[k] = val;
  legacy25.erase("text_config");
  legacy25["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {16, 24, 24}}};
  legacy25.erase("rope_parameters");
  const std::vector<std::pair<std::string, json>> bases = {
      {"qwen2_vl_legacy", json::parse(kQwen2Vl2b)},
      {"qwen2_5_vl_text_config", json::parse(kQwen25New)},
      {"qwen2_vl_text_config_disagrees", both},
      {"qwen2_5_vl_legacy", legacy25}};
  std::vector<Variant> out;
  for (const auto& [bname, base] : bases) {
    out.push_back({bname, base});
    for (const char* section : {"", "text_config", "vision_config"}) {
      const json& obj = *section ? base.value(section, json::object()) : base;
      for (const auto& [k, val] : obj.items()) {
        if (std::string(section).empty() && (k == "model_type" || k == "text_config" || k == "vision_config"))
          continue;
        json v = base;
        (*section ? v[section] : v).erase(k);
        out.push_back({bname + " -" + (*section ? std::string(section) + "." : "") + k, v});
        for (const char* rope : {"rope_scaling", "rope_parameters"}) {
          if (k != rope || !val.is_object()) continue;
          for (const auto& [rk, rv] : val.items()) {
            json w = base;
            (*section ? w[section] : w)[rope].erase(rk);
            out.push_back({bname + " -" + (*section ? std::string(section) + "." : "") + rope + "." + rk, w});
          }
        }
      }
    }
    for (const char* section : {"vision_config", "text_config"}) {
      if (!base.contains(section)) continue;
      json v = base;
      v.erase(section);
      out.push_back({bname + " -" + section + " (whole)", v});
    }
  }
  json kv_null = json::parse(kQwen2Vl2b);
  kv_null["num_key_value_heads"] = nullptr;
  out.push_back({"num_key_value_heads null", kv_null});
  json eos_list = json::parse(kQwen25New);
  eos_list["text_config"]["eos_token_id"] = {151645, 151643};
  out.push_back({"eos list", eos_list});
  json tie_text = json::parse(kQwen25New);
  tie_text.erase("tie_word_embeddings");
  tie_text["text_config"]["tie_word_embeddings"] = true;
  out.push_back({"tie only in text_config", tie_text});
  json untie = json::parse(kQwen2Vl2b);
  untie["tie_word_embeddings"] = false;
  out.push_back({"tie false", untie});
  return out;
}

TEST(ConfigHf, MissingKeysTakeTransformersDefaults) {
  const std::string python = vlm::test::python_tool("python");  // throws, with a hint, if missing
  vlm::test::TempDir dir("config_hf");
  const auto all = variants();
  json list = json::array();
  for (const auto& v : all) list.push_back(v.config);
  vlm::test::write_file(dir / "configs.json", list.dump());
  auto r = vlm::test::run({python, vlm::test::source_dir() + "/scripts/config_reference.py", "--configs",
                         dir / "configs.json", "--out", dir / "resolved.jsonl"},
                        std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << "scripts/config_reference.py failed (" << python << "):\n" << r.output;
  std::ifstream in(dir / "resolved.jsonl");
  std::vector<json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  ASSERT_EQ(rows.size(), all.size());
  int equal = 0, both_reject = 0, invalid_model = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(all[i].name);
    std::string ours_error;
    vlm::VlmConfig ours;
    try {
      ours = vlm::parse_hf_config(all[i].config.dump(), all[i].name);
    } catch (const vlm::Error& e) {
      ours_error = e.what();
    }
    if (!rows[i]["ok"].get<bool>()) {
      EXPECT_FALSE(ours_error.empty()) << "transformers refused the file (" << rows[i]["error"]
                                       << ") but vlmtrain accepted it";
      ++both_reject;
      continue;
    }
    const vlm::VlmConfig hf = from_hf(rows[i]);
    if (!ours_error.empty()) {
      EXPECT_THROW(vlm::validate(hf, "HF values"), vlm::Error)
          << "vlmtrain rejected the file (" << ours_error << ") but the values HF resolved are valid";
      ++invalid_model;
      continue;
    }
    expect_same(ours, hf);
    ++equal;
  }
  std::cout << "config defaults: " << equal << " of " << all.size() << " config.json variants resolve "
            << "to the same values as transformers; " << invalid_model << " rejected by vlmtrain for "
            << "values HF resolved too (invalid model), " << both_reject << " refused by both\n";
  EXPECT_GT(equal, static_cast<int>(all.size()) / 2);
}

}  // namespace config_hf_test
