// Recipe (+ the model) -> data/'s option structs (data/ never sees app/config/recipe.h). Shared by
// train, eval and inspect so that every command reads a dataset the same way.
//
// What follows the model rather than the recipe: the image geometry (patch, merge, resize
// factor), mean/std and default pixel limits (its family's processor defaults and its
// preprocessor_config.json, data/processor_config.h), and the default system turn (its
// family's chat template: Qwen2-VL "You are a helpful assistant.", Qwen3-VL none).
#pragma once
#include "app/config/recipe.h"
#include "data/dataset.h"
#include "data/pixel_pipeline.h"
#include "data/sample_builder.h"
#include "vlm/model/config.h"

namespace vlm::app {

// [data] format, image_root, prompt, max_bad_fraction.
vlm::data::DatasetOptions dataset_options(const Recipe& recipe);
// [data] system_prompt over the family's default system turn (no truncation).
vlm::data::SampleOptions sample_options(const Recipe& recipe, const vlm::VlmConfig& cfg);
// The model's processor (model_pixel_config with model.path when the model is an HF
// directory, not a preset), then [data] min_pixels / max_pixels (0 = the model's) and
// max_image_tokens on top. Throws vlm::Error naming the recipe key when the token cap
// falls below min_pixels.
vlm::data::PixelConfig pixel_config(const Recipe& recipe, const vlm::VlmConfig& cfg);

// The model config the recipe describes, without weights: model.preset, else model.path's
// config.json; a model.path without config.json (a tokenizer-only directory, `inspect
// data`) gives VlmConfig's default geometry (14-px patches, merge 2) under the registry's
// first family.
vlm::VlmConfig recipe_model_config(const Recipe& recipe);

}  // namespace vlm::app
