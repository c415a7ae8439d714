// Policy table resolution and the memory plan, on the meta device (no weights).
#include <gtest/gtest.h>

#include "app/plan/memory_plan.h"
#include "sharding/parallel/policy.h"
#include "vlm/runtime/check.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"

using namespace vlm::sharding;
using namespace vlm::app;  // the cost models (app/plan/)

namespace {

vlm::VisionLanguageModel meta_model(const std::string& preset, torch::Dtype dtype = torch::kFloat32) {
  return vlm::VisionLanguageModel(vlm::preset(preset), torch::TensorOptions().device(torch::kMeta).dtype(dtype));
}

// The ocr_qwen.toml policy table.
ShardingOptions ocr_qwen_options() {
  ShardingOptions o;
  o.default_policy = "fsdp";
  o.default_strategy = "full_shard";
  o.rules = {{"visual.patch_embed|visual.blocks.*", "freeze", ""},
             {"visual.merger", "ddp", ""},
             {"model.layers.*", "fsdp", "full_shard"},
             {"model.embed_tokens|model.norm|lm_head", "fsdp", "full_shard"}};
  o.param_dtype = torch::kBFloat16;
  o.checkpoint_match = "model.layers.*";
  return o;
}

const UnitPlan& find(const std::vector<UnitPlan>& units, const std::string& path) {
  for (const auto& u : units)
    if (u.path == path) return u;
  throw std::runtime_error("no unit " + path);
}

}  // namespace

TEST(Glob, StarsAlternativesAndWholeMatch) {
  EXPECT_TRUE(glob_match("model.layers.*", "model.layers.3"));
  EXPECT_TRUE(glob_match("model.layers.*", "model.layers.3.mlp.up_proj.weight"));  // across dots
  EXPECT_FALSE(glob_match("model.layers.*", "model.layers"));
  EXPECT_FALSE(glob_match("model.layers", "model.layers.3"));  // whole-string match
  EXPECT_TRUE(glob_match("visual.merger|lm_head", "lm_head"));
  EXPECT_TRUE(glob_match("*.bias", "visual.blocks.0.attn.qkv.bias"));
  EXPECT_TRUE(glob_match("*norm*.weight", "model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(glob_match("*norm*.weight", "model.layers.0.mlp.up_proj.weight"));
  EXPECT_TRUE(glob_match("a*b*c", "aXXbYYbc"));  // backtracking
  EXPECT_FALSE(glob_match("a*b*c", "aXXbYYb"));
  EXPECT_FALSE(glob_match("", "x"));
}

TEST(Policy, OcrQwenTableOnTiny) {
  auto m = meta_model("tiny");
  const auto units = resolve_units(*m, ocr_qwen_options());
  // Every parameter in exactly one unit; counts add up.
  int64_t total = 0, nparams = 0;
  for (const auto& u : units) {
    total += u.numel;
    nparams += static_cast<int64_t>(u.params.size());
  }
  EXPECT_EQ(total, vlm::count_parameters(*m));
  EXPECT_EQ(nparams, static_cast<int64_t>(m->parameters().size()));
  EXPECT_EQ(units.front().path, "visual.patch_embed");
  EXPECT_EQ(find(units, "visual.patch_embed").policy, Policy::kFreeze);
  EXPECT_EQ(find(units, "visual.blocks.3").sharding, Sharding::kFrozen);
  EXPECT_EQ(find(units, "visual.merger").sharding, Sharding::kReplicated);
  EXPECT_EQ(find(units, "model.layers.0").sharding, Sharding::kFullShard);
  EXPECT_TRUE(find(units, "model.layers.0").checkpointed);
  EXPECT_FALSE(find(units, "visual.merger").checkpointed);
  // Tied head: an alias of the embedding's unit, no unit of its own.
  EXPECT_EQ(find(units, "model.embed_tokens").aliases, "lm_head");
  for (const auto& u : units) EXPECT_NE(u.path, "lm_head");
  EXPECT_EQ(find(units, "model.embed_tokens").rule, "rule 4 (match = \"model.embed_tokens|model.norm|lm_head\")");
  EXPECT_EQ(find(units, "model.norm").rule, "rule 4 (match = \"model.embed_tokens|model.norm|lm_head\")");
  const std::string text = unit_table_text(units);
  EXPECT_NE(text.find("visual.merger ddp - replicated "), std::string::npos) << text;
  EXPECT_NE(text.find("model.embed_tokens(lm_head) fsdp full_shard ZeRO-3 "), std::string::npos) << text;
  EXPECT_NE(text.find("model.layers.0 fsdp full_shard ZeRO-3 "), std::string::npos) << text;
}

TEST(Policy, DefaultAppliesToUnmatchedUnits) {
  auto m = meta_model("tiny");
  ShardingOptions o;
  o.rules = {{"visual.*", "freeze", ""}};
  o.default_policy = "ddp";
  o.default_strategy = "shard_optimizer";
  const auto units = resolve_units(*m, o);
  EXPECT_EQ(find(units, "visual.merger").policy, Policy::kFreeze);  // visual.* covers the merger too
  EXPECT_EQ(find(units, "model.layers.1").sharding, Sharding::kShardOptimizer);
  EXPECT_EQ(find(units, "model.layers.1").rule, "default");
}

TEST(Policy, RuleMatchingNothingIsAnErrorNamingIt) {
  auto m = meta_model("tiny");
  ShardingOptions o;
  o.rules = {{"model.layers.*", "ddp", ""}, {"model.layer.*", "freeze", ""}};
  try {
    resolve_units(*m, o);
    FAIL() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rule 2 (match = \"model.layer.*\") matches no parameter"), std::string::npos)
        << e.what();
  }
  // A rule shadowed entirely by an earlier one resolves nothing either.
  o.rules = {{"model.*", "ddp", ""}, {"model.norm", "freeze", ""}};
  EXPECT_THROW(resolve_units(*m, o), vlm::Error);
}

TEST(Policy, UnitSplitAcrossRulesIsAnError) {
  auto m = meta_model("tiny");
  ShardingOptions o;
  o.rules = {{"model.layers.0.mlp.*", "freeze", ""}};
  try {
    resolve_units(*m, o);
    FAIL() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unit model.layers.0 is split across rules"), std::string::npos) << e.what();
  }
}

TEST(Policy, BadPolicyStrategyPairs) {
  auto m = meta_model("tiny");
  ShardingOptions o;
  o.rules = {{"model.layers.*", "ddp", "full_shard"}};
  EXPECT_THROW(resolve_units(*m, o), vlm::Error);
  o.rules = {{"model.layers.*", "zero", ""}};
  EXPECT_THROW(resolve_units(*m, o), vlm::Error);
}

TEST(Policy, OptimizerGroupsAndNoDecay) {
  auto m = meta_model("tiny");
  ShardingOptions o;
  o.optim.lr = 1e-4;
  o.optim.weight_decay = 0.1;
  o.optim.groups = {{"visual.merger", 5e-4, std::nullopt}, {"model.layers.0.*", std::nullopt, 0.3}};
  const auto units = resolve_units(*m, o);
  int checked = 0;
  for (const auto& u : units)
    for (const auto& p : u.params) {
      const bool is_bias = p.name.size() > 5 && p.name.substr(p.name.size() - 5) == ".bias";
      const bool is_norm = p.name.find("norm") != std::string::npos || p.name.find("ln_q") != std::string::npos;
      const double lr = u.path == "visual.merger" ? 5e-4 : 1e-4;
      const double wd = (is_bias || is_norm) ? 0.0 : (u.path == "model.layers.0" ? 0.3 : 0.1);
      EXPECT_DOUBLE_EQ(p.lr, lr) << p.name;
      EXPECT_DOUBLE_EQ(p.weight_decay, wd) << p.name;
      checked += is_bias || is_norm;
    }
  EXPECT_GT(checked, 10);  // biases and norms exist in the tiny model
}

// REFERENCE.md "Memory" (bf16 params, P parameters, N ranks) as this engine allocates it
// (memory_plan.h): FSDP gradients are fp32 shards (4S, not 2S), replicated units keep only
// their fp32 DDP bucket buffer (4P; gradients accumulate there, no bf16 .grad is kept).
TEST(MemoryPlan, ZeroFormulasForQwen2Vl2bAtN8) {
  auto m = meta_model("qwen2-vl-2b", torch::kBFloat16);
  auto units = resolve_units(*m, ocr_qwen_options());
  const int n = 8;
  const MemoryPlan plan = plan_memory(units, n, torch::kBFloat16, torch::kFloat32);
  double total = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const double p = static_cast<double>(units[i].numel);
    const double padded = static_cast<double>((units[i].numel + n - 1) / n) * n;  // shards padded to N
    double want = 0;
    switch (units[i].sharding) {
      case Sharding::kFrozen: want = 2 * p; break;               // params only
      case Sharding::kReplicated: want = 18 * p; break;          // 2P + 4P + 12P
      case Sharding::kFullShard: want = 18 * padded / n; break;  // ZeRO-3: (2 + 4 + 12)P/N
      default: FAIL() << "unexpected sharding in this table";
    }
    EXPECT_DOUBLE_EQ(plan.units[i].total(), want) << units[i].path;
    total += want;
  }
  EXPECT_DOUBLE_EQ(plan.total.total(), total);
  // Closed form over the published parameter groups: frozen vision (665,271,296 - 34,087,936)
  // x 2, merger 34,087,936 x 18, LLM 1,543,714,304 x 18 / 8 (each unit divisible by 8 here).
  const double vision_frozen = 665271296.0 - 34087936.0;
  EXPECT_DOUBLE_EQ(plan.total.total(), 2 * vision_frozen + 18 * 34087936.0 + 18 * 1543714304.0 / 8);
  // Transient: the two largest LLM units' fp32 reduce-scatter buffers ([N*S] + [S]) and the
  // three largest gathered in bf16 (embed_tokens 151,936 x 1,536 is the largest).
  EXPECT_GT(plan.reduce_scatter_peak_bytes, 4.0 * 151936 * 1536 * (1 + 1.0 / n));
  EXPECT_GT(plan.gathered_peak_bytes, 2.0 * 151936 * 1536);
  EXPECT_DOUBLE_EQ(plan.peak_bytes(), total + plan.gathered_peak_bytes + plan.reduce_scatter_peak_bytes);
  // Other strategies on one unit: ZeRO-1 2P + 4P + 12P/N, ZeRO-2 18P/N (its full parameters
  // are transient: gathered_peak_bytes), ZeRO-3 18P/N; bf16 reduce: replicated 2P + (2P + 2P)
  // + 12P (bf16 .grad + bf16 bucket: gradients accumulate in .grad).
  const int64_t P = 8 * 1000;
  EXPECT_DOUBLE_EQ(unit_memory(Sharding::kShardOptimizer, P, n, torch::kBFloat16).total(), 6.0 * P + 12.0 * P / n);
  EXPECT_DOUBLE_EQ(unit_memory(Sharding::kShardOptimizer, P, n, torch::kBFloat16).grad_bytes, 4.0 * P);
  EXPECT_DOUBLE_EQ(unit_memory(Sharding::kShardGradOp, P, n, torch::kBFloat16).total(), 18.0 * P / n);
  EXPECT_DOUBLE_EQ(unit_memory(Sharding::kFullShard, P, n, torch::kBFloat16).total(), 18.0 * P / n);
  EXPECT_DOUBLE_EQ(unit_memory(Sharding::kReplicated, P, n, torch::kBFloat16, torch::kBFloat16).total(), 18.0 * P);
  // fp32 params: the master is the parameter itself (4P + (4P + 4P) + 8P).
  EXPECT_DOUBLE_EQ(unit_memory(Sharding::kReplicated, P, n, torch::kFloat32).total(), 20.0 * P);
}

TEST(MemoryPlan, WarnsAboutTinyShardedAndGiantUnits) {
  auto m = meta_model("qwen2-vl-2b", torch::kBFloat16);
  ShardingOptions o = ocr_qwen_options();
  const auto units = resolve_units(*m, o);
  const MemoryPlan plan = plan_memory(units, 8, torch::kBFloat16);
  // model.norm (1,536 params) is fully sharded: tiny.
  bool tiny = false;
  for (const auto& w : plan.warnings) tiny |= w.find("unit model.norm is tiny") != std::string::npos;
  EXPECT_TRUE(tiny);
  // No unit of the 2B model exceeds 2 GiB.
  for (const auto& w : plan.warnings) EXPECT_EQ(w.find("giant"), std::string::npos) << w;
  // A replicated 1.2e9-parameter unit (2.2 GiB in bf16) is held whole on every rank: giant.
  UnitPlan big;
  big.path = "big";
  big.numel = 1200000000;
  big.sharding = Sharding::kReplicated;
  const MemoryPlan p2 = plan_memory({big}, 8, torch::kBFloat16);
  ASSERT_EQ(p2.warnings.size(), 1u);
  EXPECT_NE(p2.warnings[0].find("unit big is giant"), std::string::npos) << p2.warnings[0];
}
