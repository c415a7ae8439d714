// LoRA as a policy of the table (policy.h): attach_lora gives the Linear modules that a
// `policy = "lora"` rule selects their adapters (vlm/model/lora.h), before resolve_units splits
// each unit holding adapters into its frozen base and its trained adapters.
//
//   [[sharding.module]]
//   match = "model.layers.*.self_attn.q_proj|model.layers.*.self_attn.k_proj|..."
//   policy = "lora"
//   r = 8            # rank
//   alpha = 16       # scaling alpha / r (alpha / sqrt(r) with rslora = true)
//   dropout = 0.05   # on the adapter input, training only
//   init = "kaiming" # A: kaiming-uniform (PEFT's default) | gaussian; B = 0
//   strategy = "full_shard"   # optional: FSDP of the frozen base ("" = replicated)
//
// First match wins over the whole table, as for parameters: a Linear whose module path,
// unit path or parameter names an earlier rule matches keeps that rule (no adapter). The
// head (lm_head, or the tied embedding) takes no adapter: the loss computes with its weight
// directly (chunked cross-entropy). A Linear that already has an adapter (a PEFT adapter or a
// checkpoint's, loaded before) keeps it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sharding/parallel/policy.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::sharding {

// Adds the adapters the lora rules of `opts` select, initialised from opts.lora_seed (the
// same on every rank), in the base weights' dtype and device (meta for plan). Returns the
// full paths of the adapted modules (those adapted before included), in registration order.
// Throws vlm::Error for a lora rule on the head and for bad LoRA options (naming the rule).
std::vector<std::string> attach_lora(vlm::VisionLanguageModelImpl& model, const ShardingOptions& opts);

// Parameter counts of a unit table: all parameters, and those the optimizer trains.
struct ParamCounts {
  int64_t total = 0;
  int64_t trainable = 0;
};
ParamCounts count_params(const std::vector<UnitPlan>& units);

}  // namespace vlm::sharding
