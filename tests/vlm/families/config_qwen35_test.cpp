// Qwen3.5 configs: a preset's config.json (to_hf_json) parses back to the preset and
// transformers builds the same model from it (every preset's total against transformers'
// meta-device count is ConfigQwen3Hf.EveryPresetTotalEqualsTransformersCount); keys missing
// from a Qwen3.5 config.json take transformers' defaults (the 9B file with each key removed,
// resolved by AutoConfig through scripts/config_reference.py); bad values are refused with
// the file and key named.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"

namespace {

using nlohmann::json;

void q35_expect_same(const vlm::VlmConfig& a, const vlm::VlmConfig& b) {
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
  EXPECT_EQ(ta.partial_rotary_factor, tb.partial_rotary_factor);
  EXPECT_EQ(ta.max_position_embeddings, tb.max_position_embeddings);
  EXPECT_EQ(ta.layer_types, tb.layer_types);
  EXPECT_EQ(ta.linear_num_key_heads, tb.linear_num_key_heads);
  EXPECT_EQ(ta.linear_num_value_heads, tb.linear_num_value_heads);
  EXPECT_EQ(ta.linear_key_head_dim, tb.linear_key_head_dim);
  EXPECT_EQ(ta.linear_value_head_dim, tb.linear_value_head_dim);
  EXPECT_EQ(ta.linear_conv_kernel_dim, tb.linear_conv_kernel_dim);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.image_token_id, b.image_token_id);
  EXPECT_EQ(a.video_token_id, b.video_token_id);
  EXPECT_EQ(a.vision_start_token_id, b.vision_start_token_id);
  EXPECT_EQ(a.vision_end_token_id, b.vision_end_token_id);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
}

std::vector<json> q35_resolve(const json& configs) {
  const std::string python = vlm::test::python_tool("python");  // throws, with a hint, if missing
  vlm::test::TempDir dir("config_q35");
  vlm::test::write_file(dir / "configs.json", configs.dump());
  auto r = vlm::test::run({python, vlm::test::source_dir() + "/scripts/config_reference.py", "--configs",
                           dir / "configs.json", "--out", dir / "resolved.jsonl"},
                          std::chrono::seconds(300));
  EXPECT_EQ(r.exit_code, 0) << "scripts/config_reference.py failed (" << python << "):\n" << r.output;
  std::ifstream in(dir / "resolved.jsonl");
  std::vector<json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

// The VlmConfig that transformers' resolved Qwen3.5 values describe (the fixed features:
// gated attention, q/k norms, zero-centred norms, interleaved M-RoPE, as its modules are).
vlm::VlmConfig q35_from_hf(const json& r) {
  vlm::VlmConfig c = vlm::preset("tiny-qwen3.5");  // the features; every value below overwritten
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
  ct.partial_rotary_factor = t["partial_rotary_factor"];
  ct.max_position_embeddings = t["max_position_embeddings"];
  ct.hidden_act = t["hidden_act"];
  ct.attention_bias = t["attention_bias"];
  ct.layer_types.clear();
  for (const auto& s : t["layer_types"])
    ct.layer_types.push_back(s == "full_attention" ? vlm::MixerKind::full_attention : vlm::MixerKind::linear_attention);
  ct.linear_num_key_heads = t["linear_num_key_heads"];
  ct.linear_num_value_heads = t["linear_num_value_heads"];
  ct.linear_key_head_dim = t["linear_key_head_dim"];
  ct.linear_value_head_dim = t["linear_value_head_dim"];
  ct.linear_conv_kernel_dim = t["linear_conv_kernel_dim"];
  c.tie_word_embeddings = r["tie_word_embeddings"];
  c.image_token_id = r["image_token_id"];
  c.video_token_id = r["video_token_id"];
  c.vision_start_token_id = r["vision_start_token_id"];
  c.vision_end_token_id = r["vision_end_token_id"];
  // Qwen3_5TextConfig has no default bos / eos: absent, vlmtrain takes the vocabulary's
  // <|endoftext|> / <|im_end|>.
  c.bos_token_id = r["bos_token_id"].is_null() ? 248044 : r["bos_token_id"].get<int64_t>();
  c.eos_token_id = r["eos_token_id"].is_null() ? 248046 : r["eos_token_id"].get<int64_t>();
  return c;
}

}  // namespace

TEST(ConfigQwen35, PresetRoundTripsThroughConfigJson) {
  for (const std::string n : {"tiny-qwen3.5", "qwen3.5-0.8b", "qwen3.5-9b", "qwen3.5-27b"}) {
    SCOPED_TRACE(n);
    const auto c = vlm::preset(n);
    q35_expect_same(vlm::parse_hf_config(vlm::to_hf_json(c).dump(), n + "/config.json"), c);
    EXPECT_EQ(c.text.count_layers(vlm::MixerKind::full_attention) * 4, c.text.num_hidden_layers);
    EXPECT_EQ(c.text.rotary_dim(), n == "tiny-qwen3.5" ? 16 : 64);
  }
}

TEST(ConfigQwen35, RefusesWhatItCannotRun) {
  auto expect_error = [](const json& j, const std::string& needle) {
    try {
      vlm::parse_hf_config(j.dump(), "q35/config.json");
      ADD_FAILURE() << "accepted; expected an error mentioning " << needle;
    } catch (const vlm::Error& e) {
      EXPECT_NE(std::string(e.what()).find("q35/config.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const json base = vlm::to_hf_json(vlm::preset("qwen3.5-9b"));
  json j = base;
  j["text_config"]["attention_bias"] = true;
  expect_error(j, "attention_bias");
  j = base;
  j["text_config"]["layer_types"][3] = "sliding_attention";
  expect_error(j, "layer_types[3]");
  j = base;
  j["text_config"]["layer_types"].erase(0);
  expect_error(j, "layer_types has 31 entries");
  j = base;
  j["text_config"]["linear_num_value_heads"] = 24;
  j["text_config"]["linear_num_key_heads"] = 16;
  expect_error(j, "linear_num_value_heads");
  j = base;
  j["text_config"]["rope_parameters"]["mrope_section"] = {16, 24, 24};
  expect_error(j, "mrope_section");
  j = base;
  j["text_config"]["rope_parameters"]["partial_rotary_factor"] = 1.5;
  expect_error(j, "partial_rotary_factor");
}

TEST(ConfigQwen35Hf, MissingKeysTakeTransformersDefaults) {
  const json base = vlm::to_hf_json(vlm::preset("qwen3.5-9b"));
  std::vector<std::pair<std::string, json>> variants{{"preset", base}};
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
  for (const auto& [k, _] : base["text_config"]["rope_parameters"].items()) {
    json j = base;
    j["text_config"]["rope_parameters"].erase(k);
    variants.push_back({"-rope_parameters." + k, j});
  }
  json interval = base;  // layer_types absent, every 2nd layer full attention
  interval["text_config"].erase("layer_types");
  interval["text_config"]["full_attention_interval"] = 2;
  variants.push_back({"full_attention_interval=2", interval});
  json list = json::array();
  for (const auto& v : variants) list.push_back(v.second);
  const auto rows = q35_resolve(list);
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
    const vlm::VlmConfig hf = q35_from_hf(rows[i]);
    if (!ours_error.empty()) {
      EXPECT_THROW(vlm::validate(hf, "HF values"), vlm::Error) << "vlmtrain rejected the file (" << ours_error
                                                                << ") but the values HF resolved are valid";
      ++invalid;
      continue;
    }
    q35_expect_same(ours, hf);
    ++equal;
  }
  std::cout << "qwen3_5 config defaults: " << equal << " of " << variants.size()
            << " variants resolve to transformers' values; " << invalid << " invalid models rejected by both\n";
  EXPECT_GT(equal, static_cast<int>(variants.size()) / 2);
}
