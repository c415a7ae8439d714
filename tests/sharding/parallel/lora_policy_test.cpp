// LoRA in the policy table (sharding/parallel/lora.h): which Linear modules get adapters, how a unit
// with adapters splits into its frozen base and its trained adapters, the parameter counts
// (against the formula r * (in + out) per adapted Linear), and the errors. Meta device.
#include <gtest/gtest.h>

#include "sharding/parallel/lora.h"
#include "app/plan/memory_plan.h"
#include "sharding/parallel/policy.h"
#include "vlm/runtime/check.h"
#include "vlm/model/lora.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"

using namespace vlm::sharding;
using namespace vlm::app;  // the cost models (app/plan/)

namespace {

vlm::VisionLanguageModel lora_meta_model(const std::string& preset) {
  return vlm::VisionLanguageModel(vlm::preset(preset), torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16));
}

PolicyRule lora_rule(const std::string& match, int64_t r, const std::string& strategy = "") {
  PolicyRule rule{match, "lora", strategy, {}};
  rule.lora.r = r;
  return rule;
}

const char kQkvo[] =
    "model.layers.*.self_attn.q_proj|model.layers.*.self_attn.k_proj|model.layers.*.self_attn.v_proj|"
    "model.layers.*.self_attn.o_proj";

std::string lora_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const vlm::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// The number: qwen2-vl-2b, r = 8 on q, k, v, o of every LLM layer, the rest frozen.
TEST(LoraPolicy, Qwen2Vl2bQkvoR8TrainsFormulaCount) {
  auto m = lora_meta_model("qwen2-vl-2b");
  const vlm::VlmConfig cfg = vlm::preset("qwen2-vl-2b");
  ShardingOptions o;
  o.default_policy = "freeze";
  o.rules = {lora_rule(kQkvo, 8, "full_shard")};
  o.param_dtype = torch::kBFloat16;
  const int64_t base_total = vlm::count_parameters(*m);
  const auto adapted = attach_lora(*m, o);
  ASSERT_EQ(adapted.size(), static_cast<size_t>(4 * cfg.text.num_hidden_layers));
  const auto units = resolve_units(*m, o);
  // Formula: sum over adapted Linears of r * (in + out); q/o: d -> d, k/v: d -> kv_heads * head_dim.
  const int64_t d = cfg.text.hidden_size;
  const int64_t kv = cfg.text.num_key_value_heads * (d / cfg.text.num_attention_heads);
  const int64_t per_layer = 8 * ((d + d) + (d + kv) + (d + kv) + (d + d));
  const ParamCounts c = count_params(units);
  EXPECT_EQ(c.trainable, cfg.text.num_hidden_layers * per_layer);
  EXPECT_EQ(c.trainable, 2179072);  // the number the issue states for this configuration
  EXPECT_EQ(c.total, base_total + c.trainable);
  // Every layer: a frozen sharded base row followed by its adapter row.
  for (size_t i = 0; i < units.size(); ++i) {
    const auto& u = units[i];
    if (u.path.rfind("model.layers.", 0) != 0) {
      EXPECT_FALSE(u.trainable()) << u.path;
      continue;
    }
    if (u.adapter_of.empty()) {
      EXPECT_TRUE(u.has_adapters) << u.path;
      EXPECT_EQ(u.policy, Policy::kLora);
      EXPECT_EQ(u.sharding, Sharding::kFrozenSharded) << u.path;
      ASSERT_LT(i + 1, units.size());
      EXPECT_EQ(units[i + 1].adapter_of, u.path);
      EXPECT_EQ(units[i + 1].path, u.path + "+lora");
    } else {
      EXPECT_EQ(u.sharding, Sharding::kReplicated);
      EXPECT_EQ(u.numel, per_layer);
      ASSERT_EQ(u.params.size(), 8u);
      for (const auto& p : u.params) EXPECT_TRUE(vlm::is_lora_param(p.name)) << p.name;
      EXPECT_EQ(u.params[0].name, u.adapter_of + ".self_attn.q_proj.lora_A.weight");
      EXPECT_EQ(u.params[0].param.sizes(), (std::vector<int64_t>{8, d}));
      EXPECT_EQ(u.params[1].param.sizes(), (std::vector<int64_t>{d, 8}));
    }
  }
  // Memory plan: adapters replicated with fp32 masters + moments; base sharded over 8.
  const MemoryPlan mem = plan_memory(units, 8, torch::kBFloat16);
  double adapters = 0;
  for (size_t i = 0; i < units.size(); ++i)
    if (!units[i].adapter_of.empty()) adapters += mem.units[i].optim_bytes;
  EXPECT_EQ(adapters, 12.0 * 2179072);  // master 4 + m 4 + v 4 bytes each (bf16 params)
}

TEST(LoraPolicy, FirstMatchWinsAndOtherUnitsKeepTheirPolicies) {
  auto m = lora_meta_model("tiny");
  ShardingOptions o;
  o.default_policy = "freeze";
  o.rules = {{"model.layers.0", "freeze", "", {}}, {"visual.merger", "ddp", "", {}},
             lora_rule("model.layers.*.mlp.*_proj", 4)};
  const auto adapted = attach_lora(*m, o);
  for (const auto& p : adapted) EXPECT_EQ(p.find("model.layers.0."), std::string::npos) << p;  // rule 1 took it
  const int64_t layers = vlm::preset("tiny").text.num_hidden_layers;
  EXPECT_EQ(adapted.size(), static_cast<size_t>(3 * (layers - 1)));  // gate, up, down
  const auto units = resolve_units(*m, o);
  for (const auto& u : units) {
    if (u.path == "visual.merger") {
      EXPECT_EQ(u.sharding, Sharding::kReplicated);
    } else if (u.path == "model.layers.0") {
      EXPECT_EQ(u.policy, Policy::kFreeze);
    } else if (u.path == "model.layers.1") {
      EXPECT_EQ(u.sharding, Sharding::kFrozen);  // lora base, not sharded
    }
  }
  // Attaching again keeps the adapters (a resumed or PEFT-loaded model): same list.
  EXPECT_EQ(attach_lora(*m, o), adapted);
}

TEST(LoraPolicy, Errors) {
  {  // the rest of a unit with adapters must be frozen
    auto m = lora_meta_model("tiny");
    ShardingOptions o;
    o.default_policy = "ddp";
    o.rules = {lora_rule("model.layers.*.self_attn.q_proj", 4)};
    attach_lora(*m, o);
    const std::string e = lora_error_of([&] { resolve_units(*m, o); });
    EXPECT_NE(e.find("has LoRA adapters"), std::string::npos) << e;
    EXPECT_NE(e.find("must be frozen"), std::string::npos) << e;
  }
  {  // the head takes no adapter
    vlm::VlmConfig cfg = vlm::preset("tiny");
    cfg.tie_word_embeddings = false;
    vlm::VisionLanguageModel m(cfg, torch::TensorOptions().device(torch::kMeta));
    ShardingOptions o;
    o.default_policy = "freeze";
    o.rules = {lora_rule("lm_head", 4)};
    const std::string e = lora_error_of([&] { attach_lora(*m, o); });
    EXPECT_NE(e.find("lm_head, which takes no adapter"), std::string::npos) << e;
  }
  {  // a lora rule that selects nothing names itself
    auto m = lora_meta_model("tiny");
    ShardingOptions o;
    o.default_policy = "freeze";
    o.rules = {lora_rule("model.layers.*.nothing_here", 4)};
    attach_lora(*m, o);
    const std::string e = lora_error_of([&] { resolve_units(*m, o); });
    EXPECT_NE(e.find("rule 1 (match = \"model.layers.*.nothing_here\") (policy = \"lora\") selects no Linear"),
              std::string::npos)
        << e;
  }
  {  // bad options, and lora as the default
    auto m = lora_meta_model("tiny");
    ShardingOptions o;
    o.rules = {lora_rule("model.layers.*.self_attn.q_proj", 0)};
    EXPECT_NE(lora_error_of([&] { attach_lora(*m, o); }).find("r must be >= 1, got 0"), std::string::npos);
    o.rules = {};
    o.default_policy = "lora";
    EXPECT_NE(lora_error_of([&] { resolve_units(*m, o); }).find("cannot be the default"), std::string::npos);
    EXPECT_THROW(sharding_of(Policy::kLora, Strategy::kShardGradOp), vlm::Error);
    // The frozen base (and a frozen unit) may be sharded over the world or in shard groups.
    EXPECT_EQ(sharding_of(Policy::kLora, Strategy::kHybridShard), Sharding::kFrozenHybrid);
    EXPECT_EQ(sharding_of(Policy::kFreeze, Strategy::kHybridShard), Sharding::kFrozenHybrid);
    EXPECT_EQ(sharding_of(Policy::kFreeze, Strategy::kFullShard), Sharding::kFrozenSharded);
    UnitPlan frozen;
    frozen.sharding = Sharding::kFrozenHybrid;
    EXPECT_FALSE(frozen.trainable());
  }
}
