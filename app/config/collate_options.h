// Recipe -> collate's budgets (collate/ never sees app/config/recipe.h).
#pragma once
#include "app/config/recipe.h"
#include "collate/step_plan.h"
#include "data/pixel_pipeline.h"

namespace vlm::app {

// `pixels` (the model's resolved processor, pixel_config(recipe, cfg): pixel limits,
// max_image_tokens and the resize factor) and [data] max_seq_len, [batch] max_tokens,
// max_image_tokens, max_micro_batches, packing -> the step plan's budgets.
vlm::collate::Budgets collate_budgets(const Recipe& recipe, const vlm::data::PixelConfig& pixels);

}  // namespace vlm::app
