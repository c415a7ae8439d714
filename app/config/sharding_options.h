// Recipe -> sharding's plain option struct (sharding/ never sees app/config/recipe.h).
#pragma once
#include "app/config/recipe.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/policy.h"

namespace vlm::app {

// [sharding], [optim], [precision], [activation_checkpointing] -> ShardingOptions.
vlm::sharding::ShardingOptions sharding_options(const Recipe& recipe);

// Whether a [[sharding.module]] rule or sharding.default_strategy is hybrid_shard.
bool uses_hybrid_shard(const Recipe& recipe);

// [dist] -> ParallelOptions (the mesh only when the recipe uses hybrid_shard).
vlm::sharding::ParallelOptions parallel_options(const Recipe& recipe);

// "fp32" -> kFloat32, "bf16" -> kBFloat16 (the recipe's dtype spellings).
torch::Dtype recipe_dtype(const std::string& name);

}  // namespace vlm::app
