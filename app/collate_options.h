// Recipe -> collate's budgets (collate/ never sees app/recipe.h).
#pragma once
#include "app/recipe.h"
#include "collate/step_plan.h"
#include "data/pixel_pipeline.h"

namespace vlmtrain {

// `pixels` (the model's resolved processor, pixel_config(recipe, cfg): pixel limits,
// max_image_tokens and the resize factor) and [data] max_seq_len, [batch] max_tokens,
// max_image_tokens, max_micro_batches, packing -> the step plan's budgets.
vlm::collate::Budgets collate_budgets(const Recipe& recipe, const vlm::data::PixelConfig& pixels);

}  // namespace vlmtrain
