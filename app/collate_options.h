// Recipe -> collate's budgets (collate/ never sees app/recipe.h).
#pragma once
#include "app/recipe.h"
#include "collate/step_plan.h"

namespace vlmtrain {

// [data] min/max pixels, max_image_tokens, max_seq_len and [batch] max_tokens,
// max_image_tokens, max_micro_batches -> the step plan's budgets.
vlm::collate::Budgets collate_budgets(const Recipe& recipe);

}  // namespace vlmtrain
