// The model-family registry: one entry per architecture, as llama.cpp does it. An entry
// holds everything that differs between families: how its config.json reads and writes,
// its presets, its vision tower, its image processor and chat defaults, and the tensor-name
// style its checkpoints use. A config names its entry by model_type (VlmConfig::family); the
// rest of the code asks the registry, or reads the config's feature fields (config.h), and
// never branches on which family it is.
//
//   const ModelFamilySpec& f = family_spec(cfg.family);
//   f.processor.image_mean; f.default_system; f.make_vision(cfg, opts);
//
// Adding a family
//   1. Its own files under vlm/families/: `<name>.cpp` defining
//      `const ModelFamilySpec& <name>_family()` (model_type, architecture, processor and chat
//      defaults, presets, parse / to_json / validate, make_vision), and, when its tower is new,
//      `<name>_vision.h/.cpp` (a VisionTowerImpl; vlm/model/vision_tower.h).
//   2. Its config.json key table in `<name>.cpp`: one function listing every key with the
//      field it fills and transformers' default, walked by both parse and to_json
//      (config_json.h: KeyReader, KeyWriter); keys that need code are small explicit steps.
//   3. The features its parser and presets set, so generic code needs no branch:
//      vision.norm, vision.mlp, vision.window_size (window attention) and
//      fullatt_block_indexes, vision.num_position_embeddings, vision.deepstack_visual_indexes,
//      text.attention_bias, text.qk_norm, text.mrope_interleaved,
//      text.image_frames_advance_time, text.explicit_head_dim (config.h). A feature the shared
//      layers do not have yet is a new field there, read by the code that needs it.
//   4. Its tower's VisionTowerImpl::unit_layouts() (what the activation cost model counts).
//   5. ONE line in registry.cpp: VLM_FAMILY(<name>). Nothing else outside vlm/families/
//      changes: the recipe's model.family choices, the preset list, `vlmtrain plan` and the
//      error messages all read the registry.
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
#include "vlm/text/chat_template.h"

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
  std::string model_type;     // config.json "model_type": the family's name (VlmConfig::family)
  std::string architecture;   // config.json "architectures"[0]
  std::string display_name;   // "Qwen2-VL"
  bool nested_names = false;  // export writes model.visual.* / model.language_model.* (true)
                              // or visual.* / model.* (false), as the family's hub checkpoints
  ProcessorDefaults processor;
  // System turn the chat template inserts when a conversation has none ("" = none).
  std::string default_system;
  // How conversations render (vlm/text/chat_template.h): ChatML, or Qwen3.5's (think blocks).
  ChatTemplate chat_template = ChatTemplate::kChatML;
  // config.json (model_type already matched) -> config with its features set, keys absent
  // taking transformers' defaults; throws vlm::Error naming `src` and the key.
  std::function<VlmConfig(const nlohmann::json& top, const std::string& src)> parse;
  std::function<nlohmann::json(const VlmConfig&)> to_json;
  // Family-specific consistency checks (after the shared ones in vlm::validate).
  std::function<void(const VlmConfig&, const std::string& src)> validate;
  // The `visual` module (opts.device may be meta).
  std::function<std::shared_ptr<VisionTowerImpl>(const VlmConfig&, const torch::TensorOptions&)> make_vision;
  // Built-in presets: name -> config with its features set.
  std::vector<std::pair<std::string, std::function<VlmConfig()>>> presets;
};

// Every registered family, in registration order.
const std::vector<const ModelFamilySpec*>& model_families();
// The entry whose model_type is `family` (VlmConfig::family); throws vlm::Error listing the
// registered model_types when there is none.
const ModelFamilySpec& family_spec(const std::string& family);
// nullptr when no family has this model_type.
const ModelFamilySpec* find_family(const std::string& model_type);
// "'a', 'b', 'c'": the registered model_types (for messages).
std::string known_model_types();

}  // namespace vlm
