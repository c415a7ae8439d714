// Policy table resolution (see policy.h).
#include "sharding/parallel/policy.h"

#include <map>
#include <set>
#include <tuple>

#include "vlm/model/moe.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::kFreeze: return "freeze";
    case Policy::kDdp: return "ddp";
    case Policy::kFsdp: return "fsdp";
    case Policy::kLora: return "lora";
    case Policy::kEp: return "ep";
  }
  return "?";
}

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kDefault: return "";
    case Strategy::kFullShard: return "full_shard";
    case Strategy::kShardGradOp: return "shard_grad_op";
    case Strategy::kNoShard: return "no_shard";
    case Strategy::kShardOptimizer: return "shard_optimizer";
    case Strategy::kHybridShard: return "hybrid_shard";
  }
  return "?";
}

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::kFrozen: return "frozen";
    case Sharding::kFrozenSharded: return "frozen, sharded";
    case Sharding::kFrozenHybrid: return "frozen, hybrid";
    case Sharding::kReplicated: return "replicated";
    case Sharding::kShardOptimizer: return "ZeRO-1";
    case Sharding::kShardGradOp: return "ZeRO-2";
    case Sharding::kFullShard: return "ZeRO-3";
    case Sharding::kHybridShard: return "ZeRO-3 hybrid";
    case Sharding::kExpert: return "experts (ep)";
  }
  return "?";
}

Policy parse_policy(const std::string& s) {
  if (s == "freeze") return Policy::kFreeze;
  if (s == "ddp") return Policy::kDdp;
  if (s == "fsdp") return Policy::kFsdp;
  if (s == "lora") return Policy::kLora;
  if (s == "ep") return Policy::kEp;
  throw Error(str("sharding policy: expected one of freeze | ddp | fsdp | lora | ep, got '", s, "'"));
}

Strategy parse_strategy(const std::string& s) {
  if (s.empty()) return Strategy::kDefault;
  if (s == "full_shard") return Strategy::kFullShard;
  if (s == "shard_grad_op") return Strategy::kShardGradOp;
  if (s == "no_shard") return Strategy::kNoShard;
  if (s == "shard_optimizer") return Strategy::kShardOptimizer;
  if (s == "hybrid_shard") return Strategy::kHybridShard;
  throw Error(str("sharding strategy: expected one of \"\" | full_shard | shard_grad_op | no_shard | "
                  "shard_optimizer | hybrid_shard, got '", s, "'"));
}

Sharding sharding_of(Policy p, Strategy s) {
  switch (p) {
    case Policy::kFreeze:
    case Policy::kLora:  // the frozen base
      if (s == Strategy::kDefault || s == Strategy::kNoShard) return Sharding::kFrozen;
      if (s == Strategy::kFullShard) return Sharding::kFrozenSharded;
      if (s == Strategy::kHybridShard) return Sharding::kFrozenHybrid;
      break;
    case Policy::kDdp:
      if (s == Strategy::kDefault || s == Strategy::kNoShard) return Sharding::kReplicated;
      if (s == Strategy::kShardOptimizer) return Sharding::kShardOptimizer;
      break;
    case Policy::kFsdp:
      if (s == Strategy::kDefault || s == Strategy::kFullShard) return Sharding::kFullShard;
      if (s == Strategy::kShardGradOp) return Sharding::kShardGradOp;
      if (s == Strategy::kHybridShard) return Sharding::kHybridShard;
      if (s == Strategy::kNoShard) return Sharding::kReplicated;
      if (s == Strategy::kShardOptimizer) return Sharding::kShardOptimizer;
      break;
    case Policy::kEp:
      if (s == Strategy::kDefault) return Sharding::kExpert;
      break;
  }
  throw Error(str("sharding: policy '", policy_name(p), "' does not take strategy '", strategy_name(s),
                  "' (hint: ddp takes \"\" or shard_optimizer; fsdp takes full_shard, shard_grad_op, "
                  "hybrid_shard, no_shard; freeze and lora take \"\", full_shard or hybrid_shard; ep takes none)"));
}

namespace {

// '*' = any run of characters; iterative matcher with backtracking on the last star.
bool glob_one(const std::string& p, const std::string& s) {
  size_t pi = 0, si = 0, star = std::string::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (pi < p.size() && p[pi] == s[si]) {
      ++pi;
      ++si;
    } else if (star != std::string::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

// Names a rule or group may match for one parameter: the parameter, its unit, aliases.
bool matches_any(const std::string& glob, const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (glob_match(glob, n)) return true;
  return false;
}

}  // namespace

bool glob_match(const std::string& pattern, const std::string& name) {
  size_t start = 0;
  while (true) {
    const size_t bar = pattern.find('|', start);
    const std::string alt = pattern.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
    if (!alt.empty() && glob_one(alt, name)) return true;
    if (bar == std::string::npos) return false;
    start = bar + 1;
  }
}

int first_rule(const ShardingOptions& opts, const std::vector<std::string>& names, bool lora_rules) {
  for (size_t i = 0; i < opts.rules.size(); ++i) {
    if (!lora_rules && opts.rules[i].policy == "lora") continue;
    if (matches_any(opts.rules[i].match, names)) return static_cast<int>(i);
  }
  return -1;
}

std::vector<std::string> linear_match_names(const std::string& module_path, const vlm::LinearImpl& lin,
                                            const std::vector<std::string>& unit_names) {
  std::vector<std::string> names = unit_names;
  names.push_back(module_path);
  names.push_back(module_path + ".weight");
  if (lin.bias.defined()) names.push_back(module_path + ".bias");
  return names;
}

namespace {

// The module path of a parameter of an adapted Linear ("...q_proj.weight", "...q_proj.bias",
// "...q_proj.lora_A.weight" -> "...q_proj"); "" when `name` is not one.
std::string adapted_module_of(const std::string& name, const std::map<std::string, int>& adapted) {
  for (const char* suffix : {".lora_A.weight", ".lora_B.weight", ".weight", ".bias"}) {
    const std::string sfx(suffix);
    if (name.size() > sfx.size() && name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
      const std::string module = name.substr(0, name.size() - sfx.size());
      if (adapted.count(module)) return module;
    }
  }
  return "";
}

// Full names of the MoE experts' parameters inside `unit` (vlm/model/moe.h), the only ones
// an ep rule may take, with the flat offset of the held experts in the full tensor
// (first_expert x elements per expert; 0 when every expert is held) and its numel (all E).
std::map<std::string, std::pair<int64_t, int64_t>> expert_param_names(torch::nn::Module& unit,
                                                                      const std::string& unit_path) {
  std::map<std::string, std::pair<int64_t, int64_t>> out;
  for (const auto& m : unit.named_modules("", /*include_self=*/true)) {
    const auto* experts = m.value()->as<vlm::MoeExpertsImpl>();
    if (experts == nullptr) continue;
    for (const auto& p : m.value()->named_parameters(/*recurse=*/false)) {
      const int64_t per = p.value().numel() / experts->held();
      out[unit_path + "." + (m.key().empty() ? "" : m.key() + ".") + p.key()] = {experts->first_expert * per,
                                                                                 experts->num_experts * per};
    }
  }
  return out;
}

}  // namespace

std::vector<UnitPlan> resolve_units(vlm::VisionLanguageModelImpl& model, const ShardingOptions& opts) {
  const auto units = model.units();
  // Aliases: units that compute with another unit's parameters (tied lm_head).
  std::map<std::string, std::vector<std::string>> aliases;
  for (const auto& u : units)
    if (!u.shares_params_with.empty()) aliases[u.shares_params_with].push_back(u.path);

  const Policy default_policy = parse_policy(opts.default_policy);
  const Strategy default_strategy = parse_strategy(opts.default_strategy);
  VLM_CHECK(default_policy != Policy::kLora, "sharding.default = \"lora\": LoRA selects Linear modules, it cannot be "
            "the default (hint: add a [[sharding.module]] rule with policy = \"lora\" and set default = \"freeze\")");
  std::vector<Policy> rule_policy;
  std::vector<Strategy> rule_strategy;
  for (size_t i = 0; i < opts.rules.size(); ++i) {
    const auto& r = opts.rules[i];
    VLM_CHECK(!r.match.empty(), "sharding rule ", i + 1, ": empty match (hint: e.g. match = \"model.layers.*\")");
    rule_policy.push_back(parse_policy(r.policy));
    rule_strategy.push_back(parse_strategy(r.strategy));
    sharding_of(rule_policy.back(), rule_strategy.back());  // validates the pair early
  }
  std::vector<int64_t> rule_hits(opts.rules.size(), 0);
  auto describe_rule = [&](int i) {
    return i < 0 ? std::string("default") : str("rule ", i + 1, " (match = \"", opts.rules[i].match, "\")");
  };
  auto policy_of = [&](int rule) { return rule >= 0 ? rule_policy[rule] : default_policy; };
  auto strategy_of = [&](int rule) { return rule >= 0 ? rule_strategy[rule] : default_strategy; };

  std::vector<UnitPlan> out;
  std::set<const void*> seen;  // parameter storage identity: each parameter in one unit
  for (const auto& u : units) {
    if (!u.shares_params_with.empty()) continue;
    UnitPlan plan, adapters, experts;
    plan.path = u.path;
    const auto expert_names = expert_param_names(*u.module, u.path);
    int ep_rule = -1;
    std::vector<std::string> unit_names{u.path};
    for (const auto& a : aliases[u.path]) {
      unit_names.push_back(a);
      plan.aliases += (plan.aliases.empty() ? "" : ",") + a;
    }
    // Adapted Linear modules of this unit and the lora rule that selects each.
    std::map<std::string, int> adapted;
    int lora_rule = -1;
    for (auto& [rel, lin] : vlm::lora_modules(*u.module)) {
      const std::string path = u.path + "." + rel;
      const int rule = first_rule(opts, linear_match_names(path, *lin, unit_names), /*lora_rules=*/true);
      VLM_CHECK(rule >= 0 && rule_policy[rule] == Policy::kLora, "sharding: ", path,
                " carries a LoRA adapter but ", describe_rule(rule),
                " selects it (hint: put the policy = \"lora\" rule that matches it first)");
      if (lora_rule < 0) lora_rule = rule;
      VLM_CHECK(rule_strategy[rule] == rule_strategy[lora_rule], "sharding: unit ", u.path, " has adapters from ",
                describe_rule(lora_rule), " and ", describe_rule(rule),
                " with different strategies (hint: the frozen base of a unit is sharded one way)");
      adapted[path] = rule;
    }
    int unit_rule = -2;  // -2: not decided yet, -1: default
    std::string first_param;
    for (const auto& item : u.module->named_parameters(/*recurse=*/true)) {
      UnitParam p;
      p.name = u.path + "." + item.key();
      p.param = item.value();
      VLM_ASSERT(seen.insert(p.param.unsafeGetTensorImpl()).second, "parameter ", p.name, " in two units");
      std::vector<std::string> names = unit_names;
      names.push_back(p.name);
      for (const auto& a : aliases[u.path]) names.push_back(a + "." + item.key());
      // An expert parameter also answers to its module's path ("model.layers.1.mlp.experts").
      if (expert_names.count(p.name)) {
        names.push_back(p.name.substr(0, p.name.rfind('.')));
        std::tie(p.source_offset, p.source_numel) = expert_names.at(p.name);
      }
      const std::string module = adapted_module_of(p.name, adapted);
      const bool is_adapter = !module.empty() && vlm::is_lora_param(p.name);
      int rule = module.empty() ? first_rule(opts, names, /*lora_rules=*/false) : adapted[module];
      if (rule >= 0) ++rule_hits[rule];
      const bool is_expert = rule >= 0 && rule_policy[rule] == Policy::kEp;
      if (is_expert) {
        VLM_CHECK(expert_names.count(p.name), "sharding: ", describe_rule(rule), " (policy = \"ep\") matches ", p.name,
                  ", which is not an MoE expert parameter (hint: match the experts only, e.g. \"*.mlp.experts\"; the "
                  "router mlp.gate and a shared expert keep the unit's own rule)");
        if (ep_rule < 0) ep_rule = rule;
      } else if (!adapted.empty() && module.empty()) {
        VLM_CHECK(policy_of(rule) == Policy::kFreeze, "sharding: unit ", u.path, " has LoRA adapters (",
                  describe_rule(lora_rule), ") but ", p.name, " gets ", describe_rule(rule), " = ",
                  policy_name(policy_of(rule)), " (hint: the rest of a unit with adapters must be frozen; "
                  "train that unit in full without LoRA, or freeze it)");
      } else if (adapted.empty()) {
        if (unit_rule == -2) {
          unit_rule = rule;
          first_param = p.name;
        }
        VLM_CHECK(rule == unit_rule, "sharding: unit ", u.path, " is split across rules: ", first_param, " gets ",
                  describe_rule(unit_rule), " but ", p.name, " gets ", describe_rule(rule),
                  " (hint: a unit is indivisible; match whole units, e.g. \"", u.path, "\")");
      }
      // Optimizer group: lr from the first matching group, no weight decay on no_decay names.
      p.lr = opts.optim.lr;
      double wd = opts.optim.weight_decay;
      for (const auto& g : opts.optim.groups)
        if (matches_any(g.match, names)) {
          if (g.lr) p.lr = *g.lr;
          if (g.weight_decay) wd = *g.weight_decay;
          break;
        }
      p.weight_decay = (!opts.optim.no_decay.empty() && glob_match(opts.optim.no_decay, p.name)) ? 0.0 : wd;
      UnitPlan& dest = is_adapter ? adapters : is_expert ? experts : plan;
      dest.numel += p.param.numel();
      dest.params.push_back(std::move(p));
    }
    if (plan.params.empty()) continue;
    if (!adapted.empty()) unit_rule = lora_rule;
    plan.policy = policy_of(unit_rule);
    plan.strategy = strategy_of(unit_rule);
    plan.sharding = sharding_of(plan.policy, plan.strategy);
    plan.rule = describe_rule(unit_rule);
    plan.checkpointed = !opts.checkpoint_match.empty() && matches_any(opts.checkpoint_match, unit_names);
    plan.has_adapters = !adapted.empty();
    plan.has_experts = !experts.params.empty();
    out.push_back(std::move(plan));
    if (!experts.params.empty()) {
      experts.path = u.path + "+experts";
      experts.experts_of = u.path;
      experts.policy = Policy::kEp;
      experts.sharding = Sharding::kExpert;
      experts.rule = describe_rule(ep_rule);
      experts.checkpointed = out.back().checkpointed;
      out.push_back(std::move(experts));
    }
    if (adapted.empty()) continue;
    adapters.path = u.path + "+lora";
    adapters.adapter_of = u.path;
    adapters.policy = Policy::kLora;
    adapters.sharding = Sharding::kReplicated;
    adapters.rule = describe_rule(lora_rule);
    out.push_back(std::move(adapters));
  }
  for (size_t i = 0; i < opts.rules.size(); ++i)
    VLM_CHECK(rule_hits[i] > 0, "sharding: ", describe_rule(static_cast<int>(i)),
              rule_policy[i] == Policy::kLora ? " (policy = \"lora\") selects no Linear module" : " matches no parameter",
              " (hint: globs match unit paths such as visual.blocks.*, model.layers.*, model.embed_tokens, "
              "module paths such as model.layers.*.self_attn.q_proj, or full parameter names; an earlier rule may "
              "have taken them)");
  // Every parameter of the model is in exactly one unit.
  int64_t total = 0, n_model = 0;
  for (const auto& p : model.parameters()) {
    ++n_model;
    VLM_CHECK(seen.count(p.unsafeGetTensorImpl()), "sharding: a parameter of shape ", p.sizes(),
              " is in no unit (hint: every parameter must live under a module of VisionLanguageModel::units())");
  }
  for (const auto& u : out) total += static_cast<int64_t>(u.params.size());
  VLM_ASSERT(total == n_model, "units hold ", total, " parameters, model has ", n_model);
  return out;
}

std::string unit_table_text(const std::vector<UnitPlan>& units) {
  std::string out;
  for (const auto& u : units)
    out += str(u.path, u.aliases.empty() ? "" : "(" + u.aliases + ")", " ", policy_name(u.policy), " ",
               u.strategy == Strategy::kDefault ? "-" : strategy_name(u.strategy), " ", sharding_name(u.sharding),
               " ", u.numel, u.checkpointed ? " ckpt" : "", "\n");
  return out;
}

}  // namespace vlm::sharding
