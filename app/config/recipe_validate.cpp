// Recipe::validate: the cross-field checks, run once before a command uses the recipe.
#include <algorithm>
#include <string>

#include "app/config/recipe.h"
#include "vlm/runtime/check.h"

namespace vlm::app {
namespace {

// A match that names something: not empty, not only separators.
bool matches_any_glob_char(const std::string& s) { return s.find_first_not_of(" |") != std::string::npos; }

// dist.<key> = value > 1 (`kind`: "tensor" or "pipeline" parallelism): what is not built with
// it yet, refused by key. `load`: why it needs sharded loading; `eval_hint`: the way to evaluate.
template <class Fail>
void refuse_unbuilt(const Recipe& r, Purpose purpose, const std::string& key, int64_t value, const std::string& kind,
                    const std::string& load, const std::string& eval_hint, Fail fail) {
  const std::string k = "dist." + key, v = key + " = " + std::to_string(value);
  if (r.dist.cp > 1 || r.dist.ep > 1)
    fail(k, v + " with cp = " + std::to_string(r.dist.cp) + " and ep = " + std::to_string(r.dist.ep) + ": " + kind +
                " parallelism with context or expert parallelism is not built yet (expected cp 1 and ep 1)");
  if (r.model.router_aux_loss_coef != 0)
    fail(k, v + ": " + kind + " parallelism has no MoE load-balancing loss yet (expected model.router_aux_loss_coef = 0)");
  if (!r.model.sharded_load) fail(k, v + ": " + load);
  if (purpose == Purpose::train && !r.data.eval.empty() && (r.eval.every > 0 || r.eval.at_end))
    fail(k, v + ": evaluation inside a " + kind + "-parallel run is not built yet (expected data.eval = [] or "
                "eval.every = 0 and eval.at_end = false" + eval_hint + ")");
  for (const auto& rule : r.sharding.module)
    if (rule.policy == "lora" || rule.strategy == "hybrid_shard")
      fail(k, v + ": a sharding rule has " +
                  (rule.policy == "lora" ? std::string("policy = \"lora\"") : "strategy = \"hybrid_shard\"") +
                  ", which " + kind + " parallelism does not take yet (expected ddp / fsdp / freeze rules)");
}

// [dist]: the parallel dimensions' combinations that are not built yet, refused by key.
void validate_parallelism(const Recipe& r, Purpose purpose) {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw vlm::Error(r.location(key) + ": key '" + key + "': " + what);
  };
  if (r.dist.cp > 1 && r.dist.ep > 1)
    fail("dist.cp", "cp = " + std::to_string(r.dist.cp) + " with ep = " + std::to_string(r.dist.ep) +
                        ": context and expert parallelism together are not built yet (expected one of them 1)");
  if (r.dist.cp > 1 && r.model.router_aux_loss_coef != 0)
    fail("dist.cp", "context parallelism has no MoE load-balancing loss yet (expected model.router_aux_loss_coef = 0)");

  if (purpose == Purpose::eval) return;  // `vlmtrain eval` runs the whole model (tp 1, pp 1)
  if (r.dist.tp > 1)
    refuse_unbuilt(r, purpose, "tp", r.dist.tp, "tensor",
                   "each rank loads its slices of the weights, which needs model.sharded_load = true",
                   "; `vlmtrain eval --checkpoint` evaluates its checkpoints, putting the slices back together", fail);
  if (r.dist.pp > 1)
    refuse_unbuilt(r, purpose, "pp", r.dist.pp, "pipeline",
                   "each stage loads only its own layers, which needs model.sharded_load = true",
                   "; `vlmtrain eval --checkpoint` evaluates its checkpoints", fail);
}

}  // namespace

void Recipe::validate(Purpose purpose) const {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw vlm::Error(location(key) + ": key '" + key + "': " + what);
  };

  // model
  if (model.preset.empty() && model.path.empty())
    fail("model", "neither model.preset nor model.path is set (expected one: a built-in preset "
                  "such as \"tiny\", or an HF model directory)");
  if (!model.preset.empty() && !model.path.empty())
    fail("model.path", "both model.preset and model.path are set (expected exactly one)");
  if (!model.preset.empty()) {
    auto presets = known_presets();
    if (std::find(presets.begin(), presets.end(), model.preset) == presets.end()) {
      std::string list;
      for (const auto& p : presets) list += (list.empty() ? "" : ", ") + p;
      fail("model.preset", "unknown preset \"" + model.preset + "\" (expected one of " + list + ")");
    }
  }

  // data
  if (purpose == Purpose::train && data.train.empty())
    fail("data.train", "no training data (expected one or more JSONL files)");
  if (purpose == Purpose::eval && data.eval.empty())
    fail("data.eval", "no evaluation data (expected one or more JSONL files, or pass --data)");
  // Pixel bounds (0 = the model's default): checked here when both are set; against the
  // model's defaults and resize factor (the token cap) in pixel_config (app/config/data_options.h).
  if (data.min_pixels > 0 && data.max_pixels > 0 && data.min_pixels > data.max_pixels)
    fail("data.min_pixels", "min_pixels " + std::to_string(data.min_pixels) +
                                " is larger than max_pixels " + std::to_string(data.max_pixels));
  if (data.synth.min_height > data.synth.max_height)
    fail("data.synth.min_height", "min_height " + std::to_string(data.synth.min_height) +
                                      " is larger than max_height " + std::to_string(data.synth.max_height));
  if (batch.max_image_tokens < 4)
    fail("batch.max_image_tokens", "must hold at least the 4-token dummy/minimum image");

  // schedule
  if (purpose == Purpose::train && schedule.steps == 0 && schedule.epochs <= 0)
    fail("schedule.steps", "no training length (expected schedule.steps > 0 or schedule.epochs > 0)");
  if (schedule.steps > 0 && schedule.warmup_steps > schedule.steps)
    fail("schedule.warmup_steps", "warmup (" + std::to_string(schedule.warmup_steps) +
                                      ") is longer than the run (" + std::to_string(schedule.steps) +
                                      " steps)");

  // optimizer groups
  for (size_t i = 0; i < optim.group.size(); ++i) {
    std::string key = "optim.group[" + std::to_string(i) + "].match";
    if (!matches_any_glob_char(optim.group[i].match))
      throw vlm::Error(location(key) + ": key '" + key +
                       "': empty match (expected globs on parameter names, e.g. \"visual.merger.*\")");
  }

  // sharding policy table
  auto check_strategy = [&](const std::string& policy, const std::string& strategy,
                            const std::string& key, const std::string& where_key) {
    bool ok = true;
    if (policy == "freeze" || policy == "lora")
      ok = strategy.empty() || strategy == "full_shard" || strategy == "hybrid_shard" || strategy == "no_shard";
    else if (policy == "ddp") ok = strategy.empty() || strategy == "shard_optimizer";
    else if (policy == "fsdp") ok = strategy.empty() || strategy == "full_shard" ||
                                   strategy == "shard_grad_op" || strategy == "hybrid_shard" ||
                                   strategy == "no_shard";
    else if (policy == "ep") ok = strategy.empty();
    if (!ok)
      throw vlm::Error(location(where_key) + ": key '" + key + "': strategy \"" + strategy +
                       "\" does not apply to policy \"" + policy +
                       "\" (fsdp: full_shard | shard_grad_op | hybrid_shard | no_shard; ddp: shard_optimizer; "
                       "freeze and lora: full_shard (the frozen weights sharded) | hybrid_shard (sharded within "
                       "groups of dist.dp_shard ranks) | no_shard; ep: none)");
  };
  check_strategy(sharding.default_policy, sharding.default_strategy, "sharding.default_strategy",
                 "sharding.default_strategy");
  for (size_t i = 0; i < sharding.module.size(); ++i) {
    const auto& rule = sharding.module[i];
    std::string base = "sharding.module[" + std::to_string(i) + "]";
    if (!matches_any_glob_char(rule.match))
      throw vlm::Error(location(base + ".match") + ": key '" + base +
                       ".match': empty match (expected globs on module paths, e.g. "
                       "\"model.layers.*\")");
    if (rule.policy.empty())
      throw vlm::Error(location(base) + ": key '" + base +
                       ".policy': missing (expected freeze, ddp, fsdp, lora or ep)");
    check_strategy(rule.policy, rule.strategy, base + ".strategy", base);
    const std::pair<const char*, bool> lora_keys[] = {{"r", rule.r.has_value()},
                                                       {"alpha", rule.alpha.has_value()},
                                                       {"dropout", rule.dropout.has_value()},
                                                       {"rslora", rule.rslora.has_value()},
                                                       {"init", rule.init.has_value()}};
    for (const auto& [k, set] : lora_keys)
      if (set && rule.policy != "lora")
        throw vlm::Error(location(base + "." + k) + ": key '" + base + "." + k + "': only policy = \"lora\" takes '" +
                         k + "' (this rule has policy = \"" + rule.policy + "\")");
  }

  validate_parallelism(*this, purpose);

  // checkpoint
  if (checkpoint.resume.empty())
    fail("checkpoint.resume", "empty (expected \"auto\", \"none\" or a checkpoint directory)");
}

}  // namespace vlm::app
