// The recipe's model: tokenizer, config (preset or HF config.json, token ids checked
// against the tokenizer) and the built module (seeded init or HF weights).
//
//   auto tok = recipe_tokenizer(recipe);
//   vlm::VlmConfig cfg = recipe_model_config(recipe, *tok);
//   vlm::Qwen2VL model = build_model(recipe, cfg, torch::kCPU, torch::kFloat32);
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>

#include "app/recipe.h"
#include "vlm/config.h"
#include "vlm/qwen2_vl.h"
#include "vlm/tokenizer.h"

namespace vlmtrain {

// model.tokenizer, else model.path. Throws naming the recipe key when neither is set.
std::string recipe_tokenizer_path(const Recipe& recipe);
std::unique_ptr<vlm::Tokenizer> recipe_tokenizer(const Recipe& recipe);

// Sets the special token ids of `cfg` (image/video pad, vision start/end, eos, bos) from
// the tokenizer, and checks that every tokenizer id fits the embedding. `keep_ids`: the
// config came from a real checkpoint, so ids must already agree (a mismatch is an error
// naming both values) instead of being overwritten. `source` names the config in errors.
void apply_tokenizer_ids(vlm::VlmConfig& cfg, const vlm::Tokenizer& tok, bool keep_ids,
                         const std::string& source);

// Preset (model.preset) or <model.path>/config.json, with token ids from `tok`.
vlm::VlmConfig recipe_model_config(const Recipe& recipe, const vlm::Tokenizer& tok);

// The module on `device` in `dtype`: weights from model.path when set (every parameter
// must be in the checkpoint), else initialised from run.seed (same values on every rank
// and for any world size). `source` (optional) receives a one-line description.
vlm::Qwen2VL build_model(const Recipe& recipe, const vlm::VlmConfig& cfg, torch::Device device,
                         torch::Dtype dtype, std::string* source = nullptr);

}  // namespace vlmtrain
