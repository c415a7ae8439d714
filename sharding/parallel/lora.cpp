// attach_lora (see lora.h).
#include "sharding/parallel/lora.h"

#include <map>

#include "vlm/runtime/check.h"

namespace vlm::sharding {

std::vector<std::string> attach_lora(vlm::VisionLanguageModelImpl& model, const ShardingOptions& opts) {
  for (size_t i = 0; i < opts.rules.size(); ++i)
    if (opts.rules[i].policy == "lora")
      opts.rules[i].lora.validate(str("sharding rule ", i + 1, " (match = \"", opts.rules[i].match, "\")"));
  std::map<std::string, std::vector<std::string>> aliases;
  for (const auto& u : model.units())
    if (!u.shares_params_with.empty()) aliases[u.shares_params_with].push_back(u.path);
  std::vector<std::string> adapted;
  for (const auto& u : model.units()) {
    if (!u.shares_params_with.empty()) continue;
    std::vector<std::string> unit_names{u.path};
    for (const auto& a : aliases[u.path]) unit_names.push_back(a);
    if (auto* head = dynamic_cast<vlm::LinearImpl*>(u.module)) {  // lm_head: the unit is a Linear
      const int rule = first_rule(opts, linear_match_names(u.path, *head, unit_names), /*lora_rules=*/true);
      VLM_CHECK(rule < 0 || opts.rules[rule].policy != "lora", "sharding rule ", rule + 1, " (match = \"",
                opts.rules[rule < 0 ? 0 : rule].match, "\", policy = \"lora\") selects ", u.path,
                ", which takes no adapter (hint: the loss computes with the head's weight directly; train it in "
                "full with ddp or fsdp, or leave it frozen)");
    }
    for (auto& [rel, lin] : vlm::linear_modules(*u.module)) {
      const std::string path = u.path + "." + rel;
      if (vlm::has_lora(*lin)) {
        adapted.push_back(path);
        continue;
      }
      const int rule = first_rule(opts, linear_match_names(path, *lin, unit_names), /*lora_rules=*/true);
      if (rule < 0 || opts.rules[rule].policy != "lora") continue;
      vlm::add_lora(*lin, opts.rules[rule].lora, opts.lora_seed, path);
      adapted.push_back(path);
    }
  }
  return adapted;
}

ParamCounts count_params(const std::vector<UnitPlan>& units) {
  ParamCounts c;
  for (const auto& u : units) {
    c.total += u.numel;
    if (u.trainable()) c.trainable += u.numel;
  }
  return c;
}

}  // namespace vlm::sharding
