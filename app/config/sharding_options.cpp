// Recipe -> ShardingOptions (see sharding_options.h).
#include "app/config/sharding_options.h"

#include "vlm/runtime/check.h"

namespace vlm::app {

torch::Dtype recipe_dtype(const std::string& name) {
  if (name == "fp32") return torch::kFloat32;
  if (name == "bf16") return torch::kBFloat16;
  throw vlm::Error("dtype: expected fp32 | bf16, got '" + name + "'");
}

vlm::sharding::ShardingOptions sharding_options(const Recipe& recipe) {
  vlm::sharding::ShardingOptions o;
  for (const auto& r : recipe.sharding.module) {
    vlm::sharding::PolicyRule rule{r.match, r.policy, r.strategy, {}};
    if (r.r) rule.lora.r = *r.r;
    if (r.alpha) rule.lora.alpha = *r.alpha;
    if (r.dropout) rule.lora.dropout = *r.dropout;
    if (r.rslora) rule.lora.rslora = *r.rslora;
    if (r.init) rule.lora.init = vlm::parse_lora_init(*r.init);
    o.rules.push_back(rule);
  }
  o.lora_seed = static_cast<uint64_t>(recipe.run.seed);
  o.default_policy = recipe.sharding.default_policy;
  o.default_strategy = recipe.sharding.default_strategy;
  o.ddp_bucket_mb = recipe.sharding.ddp_bucket_mb;
  o.fsdp_accumulate_unsharded = recipe.sharding.fsdp_accumulate == "unsharded";
  o.optimizer_offload = recipe.sharding.optimizer_offload;
  o.param_dtype = recipe_dtype(recipe.precision.param_dtype);
  o.reduce_dtype = recipe_dtype(recipe.precision.reduce_dtype);
  o.checkpoint_match = recipe.activation_checkpointing.match;
  o.cp_mode = recipe.dist.cp_mode;
  const auto& op = recipe.optim;
  o.optim.lr = op.lr;
  o.optim.weight_decay = op.weight_decay;
  o.optim.beta1 = op.beta1;
  o.optim.beta2 = op.beta2;
  o.optim.eps = op.eps;
  o.optim.grad_clip = op.grad_clip;
  o.optim.no_decay = op.no_decay;
  for (const auto& g : op.group) o.optim.groups.push_back({g.match, g.lr, g.weight_decay});
  return o;
}

bool uses_hybrid_shard(const Recipe& recipe) {
  if (recipe.sharding.default_strategy == "hybrid_shard") return true;
  for (const auto& r : recipe.sharding.module)
    if (r.strategy == "hybrid_shard") return true;
  return false;
}

vlm::sharding::ParallelOptions parallel_options(const Recipe& recipe) {
  vlm::sharding::ParallelOptions po;
  po.timeout = std::chrono::milliseconds(static_cast<int64_t>(recipe.dist.timeout_s * 1000));
  po.device = recipe.dist.device;
  po.backend = recipe.dist.backend;
  po.mesh = uses_hybrid_shard(recipe);
  po.dp_shard = static_cast<int>(recipe.dist.dp_shard);
  po.ep = static_cast<int>(recipe.dist.ep);
  po.cp = static_cast<int>(recipe.dist.cp);
  po.tp = static_cast<int>(recipe.dist.tp);
  po.pp = static_cast<int>(recipe.dist.pp);
  return po;
}

}  // namespace vlm::app
