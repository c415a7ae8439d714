// The LoRA recipe's policy rows (recipes/ocr_qwen_lora.toml's shape), shared by
// bench/lora_bench and bench/step_bench --mix lora.
#pragma once
#include <cstdint>

#include "sharding/parallel/policy.h"

namespace vlm::bench {

// Adapters of rank r (alpha 2r, dropout 0) on q/k/v/o and gate/up/down of every LLM layer,
// their frozen base fsdp full_shard; visual.merger ddp; every other module frozen.
inline void apply_lora_rules(vlm::sharding::ShardingOptions& s, int64_t r) {
  s.default_policy = "freeze";
  vlm::sharding::PolicyRule adapters{"model.layers.*.self_attn.*_proj|model.layers.*.mlp.*_proj", "lora",
                                     "full_shard", {}};
  adapters.lora.r = r;
  adapters.lora.alpha = 2.0 * static_cast<double>(r);
  s.rules = {{"visual.merger", "ddp", "", {}}, adapters};
}

}  // namespace vlm::bench
