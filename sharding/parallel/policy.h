// Policy table: the recipe's `[[sharding.module]]` rules resolved to the model's units.
//
//   ShardingOptions o;  o.rules = {{"visual.patch_embed|visual.blocks.*", "freeze", ""}, ...};
//   std::vector<UnitPlan> units = resolve_units(*model, o);   // works on the meta device
//
// Units are the model's runner units (VisionLanguageModelImpl::units(): visual.patch_embed,
// visual.blocks.N, visual.merger, model.embed_tokens, model.layers.N, model.norm, lm_head).
// A tied lm_head owns no parameter: its name is an alias of model.embed_tokens' unit.
//
// Matching (glob_match): `*` matches any run of characters, dots included; `|` separates
// alternatives; the whole name must match. A rule applies to a parameter when its glob
// matches the parameter's full name (model.layers.0.mlp.up_proj.weight), its unit's path
// (model.layers.0), or an alias of the unit (lm_head for a tied embedding). For each
// parameter the first rule in file order wins; parameters no rule matches get
// `default_policy`. A rule that resolves no parameter is an error naming the rule. All
// parameters of one unit must end with the same rule (units are indivisible), except for
// LoRA:
//
// LoRA (policy = "lora", sharding/parallel/lora.h): the rule selects Linear modules (by module path,
// unit path or parameter name, first match wins as above); attach_lora adds adapters
// (lora_A / lora_B) to them before resolve_units. A unit holding adapters becomes two rows:
//   <unit>        policy lora, its base (the adapted Linears' weights and biases and every
//                 other parameter of the unit, which must resolve to freeze): frozen, or
//                 frozen sharded with the lora rule's strategy = "full_shard" (FSDP of the
//                 frozen base: gathered for forward and backward, no gradient traffic)
//   <unit>+lora   the adapters: trained, replicated, gradients all-reduced (DDP buckets),
//                 fp32 masters; adapter_of = <unit> (the runner unit they compute in)
//
// Expert parallelism (policy = "ep", sharding/parallel/expert_parallel.h): the rule selects
// MoE experts (`*.mlp.experts`, or their parameters); their unit becomes two rows as with LoRA:
//   <unit>          the rest of the unit (attention, router mlp.gate, shared expert, norms)
//                   with its own rule (any policy but lora)
//   <unit>+experts  policy ep, sharding "experts (ep)": the experts this rank holds
//                   (E / dist.ep of them, MoeExpertsImpl::keep_experts), trained,
//                   replicated over the expert-replicate group (the world / ep ranks holding
//                   the same experts), gradients all-reduced there only (a DDP reducer of
//                   their own), fp32 masters and AdamW on the held slice; experts_of = <unit>
// A unit can hold both: LoRA on its attention, its experts ep (rows <unit>, <unit>+experts,
// <unit>+lora; the rest of the unit frozen as with LoRA alone). The ep rule takes no strategy. numel of the row counts the held experts, so resolve before
// apply_expert_parallel (or on the meta model for a plan) shows all E.
//
// This header is sharding's own plain option struct: app/ converts the recipe into it.
#pragma once
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "vlm/model/lora.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::sharding {

enum class Policy { kFreeze, kDdp, kFsdp, kLora, kEp };
// kDefault: the policy's default (ddp: replicate everything; fsdp: full_shard).
enum class Strategy { kDefault, kFullShard, kShardGradOp, kNoShard, kShardOptimizer, kHybridShard };

const char* policy_name(Policy p);
const char* strategy_name(Strategy s);  // kDefault -> ""
Policy parse_policy(const std::string& s);      // throws vlm::Error listing the choices
Strategy parse_strategy(const std::string& s);  // "" -> kDefault

// What a unit's parameters, gradients and optimizer state look like on one rank.
enum class Sharding {
  kFrozen,          // freeze (not sharded): params only
  kFrozenSharded,   // freeze + fsdp: params sharded, gathered for forward
  kFrozenHybrid,    // freeze + hybrid_shard: params sharded within a shard group (dp_shard
                    // ranks), replicated across the groups; gathered within the group
  kReplicated,      // ddp, fsdp no_shard: params, grads, optimizer state on every rank
  kShardOptimizer,  // ZeRO-1: optimizer state sharded
  kShardGradOp,     // ZeRO-2: grads + optimizer state sharded
  kFullShard,       // ZeRO-3: params + grads + optimizer state sharded
  kHybridShard,     // ZeRO-3 within a shard group (dp_shard ranks, by default a node),
                    // replicated across the dp_replicate groups: gradients reduce-scattered
                    // in the group, then all-reduced across the replicas (HSDP)
  kExpert,          // ep: this rank's experts (E / ep of each layer), params, grads and
                    // optimizer state replicated over the expert-replicate group only
};
const char* sharding_name(Sharding s);
// (policy, strategy) -> memory layout; throws for combinations that mean nothing
// (ddp + full_shard, freeze + a strategy other than ""/full_shard/no_shard). lora: the
// sharding of the frozen base ("" / no_shard: frozen, full_shard: frozen sharded,
// hybrid_shard: frozen, sharded within the shard group).
Sharding sharding_of(Policy p, Strategy s);

// One `[[sharding.module]]` row.
struct PolicyRule {
  std::string match;     // globs, '|' = or
  std::string policy;    // freeze | ddp | fsdp | lora | ep
  std::string strategy;  // "" | full_shard | shard_grad_op | no_shard | shard_optimizer | hybrid_shard
  vlm::LoraOptions lora; // policy = "lora": r, alpha, dropout, rslora, init
};

// One `[[optim.group]]` row: first match wins (globs on parameter names).
struct OptimGroupRule {
  std::string match;
  std::optional<double> lr;            // absent: AdamWOptions::lr
  std::optional<double> weight_decay;  // absent: AdamWOptions::weight_decay (or 0 if no_decay)
};

struct AdamWOptions {
  double lr = 1e-4;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global L2 norm; 0 disables
  std::string no_decay = "*.bias|*norm*.weight|*ln_q.weight";  // params without weight decay
  std::vector<OptimGroupRule> groups;  // per-module lr / weight decay
};

struct ShardingOptions {
  std::vector<PolicyRule> rules;        // in file order, first match wins
  std::string default_policy = "ddp";   // parameters no rule matches
  std::string default_strategy;
  double ddp_bucket_mb = 25;            // DDP gradient bucket size (MiB of reduce dtype)
  // FSDP gradient accumulation across micro-batches (fsdp.h): false = reduce-scatter every
  // micro-batch into the sharded fp32 grad; true = keep an unsharded sum, reduce-scatter once.
  bool fsdp_accumulate_unsharded = false;
  // Optimizer state offload (offload.h): fp32 masters and AdamW moments in host memory,
  // updated there on a background thread while the next forward runs.
  bool optimizer_offload = false;
  torch::Dtype param_dtype = torch::kFloat32;   // compute dtype of parameters
  torch::Dtype reduce_dtype = torch::kFloat32;  // gradient all-reduce dtype
  std::string checkpoint_match;         // activation checkpointing globs on unit paths ("" = none)
  // How a context-parallel group attends (recipe: dist.cp_mode; context_parallel.h): "ulysses"
  // | "ring". Read by apply_policies only when the dims' cp > 1 (the degree is ParallelOptions::cp).
  std::string cp_mode = "ulysses";
  AdamWOptions optim;
  uint64_t lora_seed = 0;               // seed of the LoRA A initialisation (sharding/parallel/lora.h)
};

// `*` any run of characters (dots included), `|` alternatives, whole-string match.
bool glob_match(const std::string& pattern, const std::string& name);

// One parameter of a unit, with its optimizer hyper-parameters.
struct UnitParam {
  std::string name;     // full HF name, e.g. "model.layers.0.mlp.up_proj.weight"
  torch::Tensor param;  // the model's parameter (shared handle)
  int64_t source_offset = 0;  // flat element of the checkpoint tensor where this parameter
                              // starts: ep experts skip the experts held before this rank's
  int64_t source_numel = 0;   // elements of that whole tensor (ep experts: all E); 0 = numel
  double lr = 0;
  double weight_decay = 0;
};

// One row of the unit table.
struct UnitPlan {
  std::string path;            // unit path ("model.layers.3")
  std::string aliases;         // other names of the unit ("lm_head" when tied), "" if none
  Policy policy = Policy::kDdp;
  Strategy strategy = Strategy::kDefault;
  Sharding sharding = Sharding::kReplicated;
  std::string rule;            // "rule 2 (match = \"visual.merger\")" or "default"
  std::vector<UnitParam> params;  // in registration order
  int64_t numel = 0;           // sum of params' numel
  bool checkpointed = false;   // activation checkpointing on this unit
  std::string adapter_of;      // LoRA adapter row: the unit whose forward computes with it
  bool has_adapters = false;   // LoRA base row: its adapters are a later row (<unit>+lora)
  std::string experts_of;      // ep row (<unit>+experts): the unit whose forward computes with it
  bool has_experts = false;    // base row of an ep unit: its experts are the next row (<unit>+experts)
  bool trainable() const {
    return sharding != Sharding::kFrozen && sharding != Sharding::kFrozenSharded && sharding != Sharding::kFrozenHybrid;
  }
};

// Resolves the policy table and the optimizer groups over the model's units (in forward
// order, units without parameters of their own omitted; a tied lm_head shows as an alias).
// Throws vlm::Error for a rule matching nothing, a unit split across rules, a parameter
// outside every unit, bad policy/strategy names.
std::vector<UnitPlan> resolve_units(vlm::VisionLanguageModelImpl& model, const ShardingOptions& opts);

// The first rule (file order) whose match fits one of `names` (-1: none); lora rules are
// skipped unless lora_rules. Used by resolve_units and attach_lora (sharding/parallel/lora.h).
int first_rule(const ShardingOptions& opts, const std::vector<std::string>& names, bool lora_rules);
// The names a rule may match for a Linear module: its unit's names, its path, its parameters.
std::vector<std::string> linear_match_names(const std::string& module_path, const vlm::LinearImpl& lin,
                                            const std::vector<std::string>& unit_names);

// The unit table as text, one line per unit: "path policy strategy sharding numel ckpt"
// (for the rank fingerprint, Fingerprint::standard's unit_table, and logs).
std::string unit_table_text(const std::vector<UnitPlan>& units);

}  // namespace vlm::sharding
