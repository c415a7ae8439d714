// The model-family registry (DESIGN.md "Model families"): one entry per architecture, as
// llama.cpp does it. An entry holds everything that differs between families: how its
// config.json reads and writes, its presets, its vision tower, its image processor and chat
// defaults, and the tensor-name style its checkpoints use. The rest of the code asks the
// registry; adding a family is its own files plus one line in registry.cpp.
//
//   const ModelFamilySpec& f = family_spec(cfg.family);
//   f.processor.image_mean; f.default_system; f.make_vision(cfg, opts);
#pragma once
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlm/model/config.h"
#include "vlm/model/vision_tower.h"

namespace vlm {

// The family's image processor defaults: what its hub preprocessor_config.json holds
// (patch, merge and temporal sizes come from the model config's vision section).
struct ProcessorDefaults {
  std::array<double, 3> image_mean{};
  std::array<double, 3> image_std{};
  int64_t min_pixels = 0;
  int64_t max_pixels = 0;
};

struct ModelFamilySpec {
  Family family;
  std::string model_type;     // config.json "model_type"
  std::string architecture;   // config.json "architectures"[0]
  std::string display_name;   // "Qwen2-VL"
  bool nested_names = false;  // export writes model.visual.* / model.language_model.* (true)
                              // or visual.* / model.* (false), as the family's hub checkpoints
  ProcessorDefaults processor;
  // System turn the chat template inserts when a conversation has none ("" = none).
  std::string default_system;
  // config.json (model_type already matched) -> config, keys absent taking transformers'
  // defaults; throws vlm::Error naming `src` and the key.
  std::function<VlmConfig(const nlohmann::json& top, const std::string& src)> parse;
  std::function<nlohmann::json(const VlmConfig&)> to_json;
  // Family-specific consistency checks (after the shared ones in vlm::validate).
  std::function<void(const VlmConfig&, const std::string& src)> validate;
  // The `visual` module (opts.device may be meta).
  std::function<std::shared_ptr<VisionTowerImpl>(const VlmConfig&, const torch::TensorOptions&)> make_vision;
  // Built-in presets: name -> config.
  std::vector<std::pair<std::string, std::function<VlmConfig()>>> presets;
};

// Every registered family, in registration order.
const std::vector<const ModelFamilySpec*>& model_families();
const ModelFamilySpec& family_spec(Family f);
// nullptr when no family has this model_type.
const ModelFamilySpec* find_family(const std::string& model_type);
// "qwen2_vl, qwen2_5_vl, qwen3_vl" (for messages).
std::string known_model_types();

// The entries, defined in the families' own files.
const ModelFamilySpec& qwen2_vl_family();
const ModelFamilySpec& qwen2_5_vl_family();
const ModelFamilySpec& qwen3_vl_family();

}  // namespace vlm
