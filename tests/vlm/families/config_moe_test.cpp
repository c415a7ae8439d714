// Mixture-of-experts configs (Qwen3-VL-MoE, Qwen3.5-MoE): a preset's config.json (to_hf_json)
// parses back to the preset; the published geometry's file with any ONE text_config key
// removed resolves to the values transformers resolves (AutoConfig through
// scripts/config_reference.py: absent keys take Qwen3VLMoeTextConfig's / Qwen3_5MoeTextConfig's
// defaults, `num_local_experts` is what HF writes for num_experts); bad expert geometry is
// refused naming the file and the key. Totals against transformers' meta-device count:
// ConfigQwen3Hf.EveryPresetTotalEqualsTransformersCount (every registered preset).
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "vlm/model/config.h"
#include "vlm/runtime/check.h"

namespace {

using nlohmann::json;

// The text fields the MoE keys and the dense ones they sit beside decide.
void moe_expect_same_text(const vlm::TextConfig& a, const vlm::TextConfig& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim(), b.head_dim());
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.num_experts_per_tok, b.num_experts_per_tok);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.shared_expert_intermediate_size, b.shared_expert_intermediate_size);
  EXPECT_EQ(a.decoder_sparse_step, b.decoder_sparse_step);
  EXPECT_EQ(a.mlp_only_layers, b.mlp_only_layers);
  EXPECT_EQ(a.router_aux_loss_coef, b.router_aux_loss_coef);
  EXPECT_EQ(a.output_router_logits, b.output_router_logits);
  EXPECT_EQ(a.count_sparse_layers(), b.count_sparse_layers());
  if (a.count_sparse_layers() < a.num_hidden_layers) EXPECT_EQ(a.intermediate_size, b.intermediate_size);
}

std::vector<json> moe_resolve(const json& configs) {
  const std::string python = vlm::test::python_tool("python");
  vlm::test::TempDir dir("config_moe");
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

// transformers' resolved text values as a TextConfig (the fields compared above).
vlm::TextConfig moe_text_from_hf(const json& t) {
  vlm::TextConfig c;
  c.vocab_size = t["vocab_size"];
  c.hidden_size = t["hidden_size"];
  c.intermediate_size = t["intermediate_size"];
  c.num_hidden_layers = t["num_hidden_layers"];
  c.num_attention_heads = t["num_attention_heads"];
  c.num_key_value_heads = t["num_key_value_heads"];
  c.explicit_head_dim = t["head_dim"].is_null() ? 0 : t["head_dim"].get<int64_t>();
  c.num_experts = t["num_experts"];
  c.num_experts_per_tok = t["num_experts_per_tok"];
  c.moe_intermediate_size = t["moe_intermediate_size"];
  c.shared_expert_intermediate_size = t["shared_expert_intermediate_size"];
  c.decoder_sparse_step = t["decoder_sparse_step"];
  c.mlp_only_layers = t["mlp_only_layers"].get<std::vector<int64_t>>();
  c.router_aux_loss_coef = t["router_aux_loss_coef"];
  c.output_router_logits = t["output_router_logits"];
  return c;
}

}  // namespace

TEST(ConfigMoe, PresetRoundTripsThroughConfigJson) {
  for (const std::string n : {"tiny-qwen3-moe", "qwen3-vl-30b-a3b", "qwen3-vl-235b-a22b", "tiny-qwen3.5-moe",
                              "qwen3.5-35b-a3b", "qwen3.5-122b-a10b", "qwen3.5-397b-a17b"}) {
    SCOPED_TRACE(n);
    const auto c = vlm::preset(n);
    const auto back = vlm::parse_hf_config(vlm::to_hf_json(c).dump(), n + "/config.json");
    EXPECT_EQ(back.family, c.family);
    moe_expect_same_text(back.text, c.text);
    EXPECT_EQ(back.text.layer_types, c.text.layer_types);
    EXPECT_GT(c.text.count_sparse_layers(), 0);
  }
  EXPECT_EQ(vlm::preset("tiny-qwen3-moe").text.count_sparse_layers(), 3);  // layer 0 dense
}

TEST(ConfigMoe, RefusesBadExpertGeometry) {
  auto expect_error = [](const json& j, const std::string& needle) {
    try {
      vlm::parse_hf_config(j.dump(), "moe/config.json");
      ADD_FAILURE() << "accepted; expected an error mentioning " << needle;
    } catch (const vlm::Error& e) {
      EXPECT_NE(std::string(e.what()).find("moe/config.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  for (const std::string n : {"qwen3-vl-30b-a3b", "qwen3.5-35b-a3b"}) {
    SCOPED_TRACE(n);
    const json base = vlm::to_hf_json(vlm::preset(n));
    json j = base;
    j["text_config"]["num_experts_per_tok"] = 1000;
    expect_error(j, "num_experts_per_tok");
    j = base;
    j["text_config"]["num_experts"] = 0;
    expect_error(j, "num_experts");
    j = base;
    j["text_config"]["moe_intermediate_size"] = -4;
    expect_error(j, "moe_intermediate_size");
    j = base;
    j["text_config"]["router_aux_loss_coef"] = "high";
    expect_error(j, "router_aux_loss_coef");
  }
}

TEST(ConfigMoeHf, MissingTextKeysTakeTransformersDefaults) {
  std::vector<std::pair<std::string, json>> variants;
  for (const std::string n : {"qwen3-vl-30b-a3b", "qwen3.5-35b-a3b"}) {
    const json base = vlm::to_hf_json(vlm::preset(n));
    variants.push_back({n, base});
    for (const auto& [k, _] : base["text_config"].items()) {
      json j = base;
      j["text_config"].erase(k);
      variants.push_back({n + " -text_config." + k, j});
    }
    json local = base;  // what transformers writes back: num_local_experts
    local["text_config"]["num_local_experts"] = local["text_config"]["num_experts"];
    local["text_config"].erase("num_experts");
    variants.push_back({n + " num_local_experts", local});
  }
  json list = json::array();
  for (const auto& v : variants) list.push_back(v.second);
  const auto rows = moe_resolve(list);
  ASSERT_EQ(rows.size(), variants.size());
  int equal = 0, invalid = 0;
  for (size_t i = 0; i < variants.size(); ++i) {
    SCOPED_TRACE(variants[i].first);
    ASSERT_TRUE(rows[i]["ok"].get<bool>()) << rows[i]["error"];
    std::string ours_error;
    vlm::VlmConfig ours;
    try {
      ours = vlm::parse_hf_config(variants[i].second.dump(), variants[i].first);
    } catch (const vlm::Error& e) {
      ours_error = e.what();
    }
    const vlm::TextConfig hf = moe_text_from_hf(rows[i]["text"]);
    if (!ours_error.empty()) {
      // Only a file whose resolved geometry no model can have may be refused (e.g. heads
      // that do not divide): say which.
      ++invalid;
      std::cout << variants[i].first << ": refused (" << ours_error << ")\n";
      continue;
    }
    moe_expect_same_text(ours.text, hf);
    ++equal;
  }
  std::cout << "MoE config defaults: " << equal << " of " << variants.size()
            << " variants resolve to transformers' values; " << invalid << " refused\n";
  EXPECT_GE(equal, static_cast<int>(variants.size()) - 4);
}
