// Qwen3-VL configs: the published config.json (Qwen/Qwen3-VL-2B-Instruct, transcribed)
// parses to the qwen3-vl-2b preset; every preset's parameter total (what `vlmtrain plan`
// prints) equals what transformers counts for the same config.json, built on the meta
// device (scripts/config_reference.py --count-params); keys missing from a Qwen3-VL
// config.json take transformers' defaults (the same file with each key removed, resolved
// by AutoConfig); bad values are refused with the key named.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"

namespace {

using nlohmann::json;

// Qwen/Qwen3-VL-2B-Instruct config.json as published (transcribed; key order kept).
constexpr const char* kQwen3Vl2b = R"({
  "architectures": ["Qwen3VLForConditionalGeneration"],
  "image_token_id": 151655,
  "model_type": "qwen3_vl",
  "text_config": {
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643, "dtype": "bfloat16",
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 262144,
    "model_type": "qwen3_vl_text", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"},
    "rope_theta": 5000000, "tie_word_embeddings": true, "use_cache": true, "vocab_size": 151936
  },
  "tie_word_embeddings": true,
  "transformers_version": "4.57.0.dev0",
  "video_token_id": 151656,
  "vision_config": {
    "deepstack_visual_indexes": [5, 11, 17], "depth": 24, "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 1024, "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4096,
    "model_type": "qwen3_vl", "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 2048,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2
  },
  "vision_end_token_id": 151653,
  "vision_start_token_id": 151652
})";

void q3_expect_same(const vlm::VlmConfig& a, const vlm::VlmConfig& b) {
  EXPECT_EQ(a.family, b.family);
  const auto &va = a.vision, &vb = b.vision;
  EXPECT_EQ(va.depth, vb.depth);
  EXPECT_EQ(va.num_heads, vb.num_heads);
  EXPECT_EQ(va.patch_size, vb.patch_size);
  EXPECT_EQ(va.temporal_patch_size, vb.temporal_patch_size);
  EXPECT_EQ(va.spatial_merge_size, vb.spatial_merge_size);
  EXPECT_EQ(va.in_chans, vb.in_chans);
  EXPECT_EQ(va.hidden_act, vb.hidden_act);
  EXPECT_EQ(va.embed_dim, vb.embed_dim);
  EXPECT_EQ(va.out_hidden_size, vb.out_hidden_size);
  EXPECT_EQ(va.intermediate_size, vb.intermediate_size);
  EXPECT_EQ(va.num_position_embeddings, vb.num_position_embeddings);
  EXPECT_EQ(va.deepstack_visual_indexes, vb.deepstack_visual_indexes);
  EXPECT_EQ(va.rope_theta, vb.rope_theta);
  const auto &ta = a.text, &tb = b.text;
  EXPECT_EQ(ta.vocab_size, tb.vocab_size);
  EXPECT_EQ(ta.hidden_size, tb.hidden_size);
  EXPECT_EQ(ta.intermediate_size, tb.intermediate_size);
  EXPECT_EQ(ta.num_hidden_layers, tb.num_hidden_layers);
  EXPECT_EQ(ta.num_attention_heads, tb.num_attention_heads);
  EXPECT_EQ(ta.num_key_value_heads, tb.num_key_value_heads);
  EXPECT_EQ(ta.head_dim(), tb.head_dim());
  EXPECT_EQ(ta.rms_norm_eps, tb.rms_norm_eps);
  EXPECT_EQ(ta.rope_theta, tb.rope_theta);
  EXPECT_EQ(ta.mrope_section, tb.mrope_section);
  EXPECT_EQ(ta.max_position_embeddings, tb.max_position_embeddings);
  EXPECT_EQ(ta.attention_bias, tb.attention_bias);
  EXPECT_EQ(ta.qk_norm, tb.qk_norm);
  EXPECT_EQ(ta.mrope_interleaved, tb.mrope_interleaved);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.image_token_id, b.image_token_id);
  EXPECT_EQ(a.video_token_id, b.video_token_id);
  EXPECT_EQ(a.vision_start_token_id, b.vision_start_token_id);
  EXPECT_EQ(a.vision_end_token_id, b.vision_end_token_id);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
}

// Runs scripts/config_reference.py on `configs`; one resolved row per config.
std::vector<json> q3_resolve(const json& configs, bool count_params) {
  const std::string python = vlm::test::python_tool("python");  // throws, with a hint, if missing
  vlm::test::TempDir dir("config_q3");
  vlm::test::write_file(dir / "configs.json", configs.dump());
  std::vector<std::string> argv{python, vlm::test::source_dir() + "/scripts/config_reference.py", "--configs",
                                dir / "configs.json", "--out", dir / "resolved.jsonl"};
  if (count_params) argv.push_back("--count-params");
  auto r = vlm::test::run(argv, std::chrono::seconds(300));
  EXPECT_EQ(r.exit_code, 0) << "scripts/config_reference.py failed (" << python << "):\n" << r.output;
  std::ifstream in(dir / "resolved.jsonl");
  std::vector<json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

// The VlmConfig that transformers' resolved Qwen3-VL values describe.
vlm::VlmConfig q3_from_hf(const json& r) {
  vlm::VlmConfig c;
  c.family = "qwen3_vl";
  const json& v = r["vision"];
  auto& cv = c.vision;
  cv.depth = v["depth"];
  cv.num_heads = v["num_heads"];
  cv.patch_size = v["patch_size"];
  cv.temporal_patch_size = v["temporal_patch_size"];
  cv.spatial_merge_size = v["spatial_merge_size"];
  cv.in_chans = v["in_chans"];
  cv.hidden_act = v["hidden_act"];
  cv.embed_dim = v["embed_dim"];
  cv.out_hidden_size = v["out_hidden_size"];
  cv.intermediate_size = v["intermediate_size"];
  cv.num_position_embeddings = v["num_position_embeddings"];
  cv.deepstack_visual_indexes = v["deepstack_visual_indexes"].get<std::vector<int64_t>>();
  cv.rope_theta = v["rope_theta"];
  const json& t = r["text"];
  auto& ct = c.text;
  ct.vocab_size = t["vocab_size"];
  ct.hidden_size = t["hidden_size"];
  ct.intermediate_size = t["intermediate_size"];
  ct.num_hidden_layers = t["num_hidden_layers"];
  ct.num_attention_heads = t["num_attention_heads"];
  ct.num_key_value_heads = t["num_key_value_heads"];
  ct.explicit_head_dim = t["head_dim"];
  ct.rms_norm_eps = t["rms_norm_eps"];
  ct.rope_theta = t["rope_theta"];
  ct.mrope_section = t["mrope_section"].get<std::vector<int64_t>>();
  ct.max_position_embeddings = t["max_position_embeddings"];
  ct.hidden_act = t["hidden_act"];
  ct.attention_bias = t["attention_bias"];
  ct.qk_norm = true;            // always, in transformers' Qwen3-VL decoder
  ct.mrope_interleaved = true;  // always, in transformers' Qwen3-VL rotary
  c.tie_word_embeddings = r["tie_word_embeddings"];
  c.image_token_id = r["image_token_id"];
  c.video_token_id = r["video_token_id"];
  c.vision_start_token_id = r["vision_start_token_id"];
  c.vision_end_token_id = r["vision_end_token_id"];
  c.bos_token_id = r["bos_token_id"].is_null() ? 151643 : r["bos_token_id"].get<int64_t>();
  c.eos_token_id = r["eos_token_id"].is_null() ? 151645 : r["eos_token_id"].get<int64_t>();
  return c;
}

}  // namespace

TEST(ConfigQwen3, PublishedConfigIsThePreset) {
  const auto parsed = vlm::parse_hf_config(kQwen3Vl2b, "Qwen3-VL-2B-Instruct/config.json");
  q3_expect_same(parsed, vlm::preset("qwen3-vl-2b"));
  EXPECT_EQ(vlm::family_name(parsed.family), "qwen3_vl");
  EXPECT_EQ(parsed.text.head_dim(), 128);  // 16 heads x 128 = 2048 here; 4B/8B: 32 x 128 != hidden
}

TEST(ConfigQwen3, RefusesWhatItCannotRun) {
  auto expect_error = [](json j, const std::string& needle) {
    try {
      vlm::parse_hf_config(j.dump(), "q3/config.json");
      ADD_FAILURE() << "accepted; expected an error mentioning " << needle;
    } catch (const vlm::Error& e) {
      EXPECT_NE(std::string(e.what()).find("q3/config.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const json base = json::parse(kQwen3Vl2b);
  json j = base;
  j["text_config"]["attention_bias"] = true;
  expect_error(j, "attention_bias");
  j = base;
  j["vision_config"]["num_position_embeddings"] = 2300;
  expect_error(j, "num_position_embeddings");
  j = base;
  j["vision_config"]["hidden_act"] = "silu";
  expect_error(j, "gelu_pytorch_tanh");
  j = base;
  j["vision_config"]["deepstack_visual_indexes"] = {5, 5};
  expect_error(j, "twice");
  j = base;
  j["model_type"] = "qwen4_exp";  // a transformers 5.23 model type vlmtrain does not register
  expect_error(j, "qwen3_vl_moe");  // the message lists the registered ones
}

TEST(ConfigQwen3Hf, EveryPresetTotalEqualsTransformersCount) {
  json configs = json::array();
  const auto names = vlm::preset_names();
  for (const auto& n : names) configs.push_back(vlm::to_hf_json(vlm::preset(n)));
  const auto rows = q3_resolve(configs, /*count_params=*/true);
  ASSERT_EQ(rows.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    ASSERT_TRUE(rows[i]["ok"].get<bool>()) << rows[i]["error"];
    vlm::VisionLanguageModel m(vlm::preset(names[i]), torch::TensorOptions().device(torch::kMeta));
    EXPECT_EQ(vlm::count_parameters(*m), rows[i]["params"].get<int64_t>());
    std::cout << names[i] << ": " << vlm::count_parameters(*m) << " parameters (transformers "
              << rows[i]["params"] << ")\n";
  }
  // What a user sees: `vlmtrain plan --preset X --json` prints the same totals.
  for (const std::string n : {"qwen3-vl-2b", "qwen3-vl-4b", "qwen3-vl-8b"}) {
    auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", "--preset", n, "--json"}, std::chrono::seconds(120));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const json plan = json::parse(r.output.substr(r.output.find('{')));
    const size_t i = static_cast<size_t>(std::find(names.begin(), names.end(), n) - names.begin());
    EXPECT_EQ(plan["total_params"].get<int64_t>(), rows[i]["params"].get<int64_t>()) << n;
  }
}

TEST(ConfigQwen3Hf, MissingKeysTakeTransformersDefaults) {
  // The published file, then the file with ONE key removed, for every key of each section.
  const json base = json::parse(kQwen3Vl2b);
  std::vector<std::pair<std::string, json>> variants{{"published", base}};
  for (const auto& [k, _] : base.items()) {
    if (k == "model_type") continue;
    json j = base;
    j.erase(k);
    variants.push_back({"-" + k, j});
  }
  for (const std::string sec : {"text_config", "vision_config"}) {
    for (const auto& [k, _] : base[sec].items()) {
      json j = base;
      j[sec].erase(k);
      variants.push_back({"-" + sec + "." + k, j});
    }
  }
  for (const auto& [k, _] : base["text_config"]["rope_scaling"].items()) {
    json j = base;
    j["text_config"]["rope_scaling"].erase(k);
    variants.push_back({"-rope_scaling." + k, j});
  }
  json list = json::array();
  for (const auto& v : variants) list.push_back(v.second);
  const auto rows = q3_resolve(list, false);
  ASSERT_EQ(rows.size(), variants.size());
  int equal = 0, invalid = 0;
  for (size_t i = 0; i < variants.size(); ++i) {
    SCOPED_TRACE(variants[i].first);
    std::string ours_error;
    vlm::VlmConfig ours;
    try {
      ours = vlm::parse_hf_config(variants[i].second.dump(), variants[i].first);
    } catch (const vlm::Error& e) {
      ours_error = e.what();
    }
    if (!rows[i]["ok"].get<bool>()) {
      EXPECT_FALSE(ours_error.empty()) << "transformers refused (" << rows[i]["error"] << "), vlmtrain accepted";
      continue;
    }
    const vlm::VlmConfig hf = q3_from_hf(rows[i]);
    if (!ours_error.empty()) {
      EXPECT_THROW(vlm::validate(hf, "HF values"), vlm::Error) << "vlmtrain rejected the file (" << ours_error
                                                                << ") but the values HF resolved are valid";
      ++invalid;
      continue;
    }
    q3_expect_same(ours, hf);
    ++equal;
  }
  std::cout << "qwen3_vl config defaults: " << equal << " of " << variants.size()
            << " variants resolve to transformers' values; " << invalid << " invalid models rejected by both\n";
  EXPECT_GT(equal, static_cast<int>(variants.size()) / 2);
}
