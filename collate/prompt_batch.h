// Generation prompts -> one LEFT-padded batch for vlm::generate (eval).
//
// Training micro-batches are right-padded (collate/micro_batch.h); generation appends one
// token per step at the end of every row, so the prompts' last tokens must line up in the
// last column: pad on the left, attention_mask 0 there. Position ids are left to generate()
// (get_rope_index skips the masked columns, so a padded row gets the same positions as the
// row alone).
//
// Names: B rows, L longest prompt, P patches (sum over images), N images.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "vlm/model/vision_language_model.h"
#include "vlm/model/sample.h"

namespace vlm::collate {

// samples: B >= 1 prompts (labels ignored), each with >= 1 token.
// returns input_ids [B, L] (pad_token_id on the left), attention_mask [B, L] int64,
// pixel_values [P, C*T*p*p] = the rows' pixel_values in row order (undefined when no row has an
// image), image_grid_thw [N, 3] int64 in the same order. labels / position_ids undefined.
// Throws vlm::Error naming the sample index for an empty prompt or pixel rows that do not
// match the sample's grids.
vlm::Batch left_padded_prompt_batch(const std::vector<const vlm::TokenizedSample*>& samples,
                                    int64_t pad_token_id);

// The stand-in prompt of a rank that has no sample left in a lockstep batch: one row holding
// one pad token, no image (generate() then runs its dummy image). [1, 1].
vlm::Batch filler_prompt_batch(int64_t pad_token_id);

}  // namespace vlm::collate
