// LoRA checkpoints as models (see lora_model.h).
#include "app/config/lora_model.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "app/config/sharding_options.h"
#include "sharding/parallel/lora.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/model/lora.h"

namespace vlm::app {

bool is_lora_checkpoint(const CheckpointReader& ck) {
  for (const auto& u : ck.trainer_json().at("units"))
    if (!u.value("stored", true)) return true;
  return false;
}

Recipe checkpoint_recipe(const CheckpointReader& ck) {
  return load_recipe((std::filesystem::path(ck.dir()) / "recipe.toml").string());
}

std::vector<std::string> full_trained_tensors(const CheckpointReader& ck) {
  std::vector<std::string> out;
  for (const auto& u : ck.trainer_json().at("units")) {
    if (!u.at("trainable").get<bool>()) continue;
    for (const auto& p : u.at("params")) {
      const std::string name = p.at("name");
      if (!vlm::is_lora_param(name)) out.push_back(name);
    }
  }
  return out;
}

std::vector<std::string> full_trained_units(const CheckpointReader& ck) {
  std::vector<std::string> out;
  for (const auto& u : ck.trainer_json().at("units")) {
    const std::string path = u.at("path");
    if (!u.at("trainable").get<bool>()) continue;
    if (path.find('+') == std::string::npos) {
      out.push_back(path);
    } else if (path.size() > 8 && path.compare(path.size() - 8, 8, "+experts") == 0) {
      // ep experts trained in full beside the adapters: their module ("model.layers.1.mlp.experts")
      for (const auto& p : u.at("params")) {
        const std::string name = p.at("name");
        const std::string module = name.substr(0, name.rfind('.'));
        if (std::find(out.begin(), out.end(), module) == out.end()) out.push_back(module);
      }
    }
  }
  return out;
}

namespace {

// Attaches the checkpoint's adapters (its recipe's lora rules) and copies every tensor the
// checkpoint holds into the model's parameter of the same name.
void load_lora_checkpoint_tensors(vlm::VisionLanguageModelImpl& model, const CheckpointReader& ck) {
  const Recipe trained = checkpoint_recipe(ck);
  vlm::sharding::attach_lora(model, sharding_options(trained));
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : model.named_parameters()) params[p.key()] = p.value();
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : ck.consolidated()) {
    auto it = params.find(name);
    VLM_CHECK(it != params.end(), ck.dir(), ": tensor ", name,
              " has no parameter in the base model (hint: evaluate or export with the base the run trained on)");
    VLM_CHECK(it->second.sizes() == t.sizes(), ck.dir(), ": tensor ", name, " has shape ", t.sizes(),
              " but the base model's parameter has ", it->second.sizes(),
              " (hint: the base is another model size than the one the run trained)");
    if (it->second.is_meta()) {  // a meta model: give the trained tensors real values
      const size_t dot = name.rfind('.');
      auto* layer = dynamic_cast<vlm::LayerBase*>(model.named_modules()[name.substr(0, dot)].get());
      VLM_CHECK(layer != nullptr, ck.dir(), ": ", name, " is not a parameter of a vlm layer");
      layer->replace_parameter(name.substr(dot + 1), t.to(torch::kFloat32).clone());
      continue;
    }
    it->second.copy_(t);
  }
}

}  // namespace

LoadedModel load_lora_checkpoint(const CheckpointReader& ck, const ModelSection& base, const LoadModelOptions& opts,
                                 const std::string& recipe_source) {
  LoadedModel lm = load_model(base, opts, recipe_source);
  load_lora_checkpoint_tensors(*lm.model, ck);
  lm.description = vlm::str(lm.description, " + LoRA checkpoint ", ck.dir(), " (step ", ck.state().step, ")");
  return lm;
}

vlm::VisionLanguageModel lora_adapters_on_meta(const CheckpointReader& ck) {
  const vlm::VlmConfig cfg = vlm::parse_hf_config(ck.config_json(), ck.dir() + "/config.json");
  vlm::VisionLanguageModel model(cfg, torch::TensorOptions().device(torch::kMeta));
  load_lora_checkpoint_tensors(*model, ck);
  return model;
}

}  // namespace vlm::app
