// How much of the LLM's work would be padding: the step plans of one epoch, computed as the
// trainer computes them (same sampler order, budgets and world size), with and without
// padding-free packing (batch.packing). No image is decoded and no sample is built: the
// plan needs only text token counts and image sizes (the dataset index).
//
//   PaddingEstimate e = estimate_padding(costs, recipe, budgets, /*world=*/1);
//   e.padded.fraction();   // padding / tokens in micro-batches, batch.packing = false
//   e.packed.fraction();   // the same with batch.packing = true (fillers only)
#pragma once
#include <cstdint>
#include <vector>

#include "app/config/recipe.h"
#include "collate/step_plan.h"

namespace vlm::app {

struct PaddingEstimate {
  int64_t steps = 0;                    // steps of epoch 0
  vlm::collate::PaddingCount padded;    // batch.packing = false
  vlm::collate::PaddingCount packed;    // batch.packing = true
  int64_t micro_batches_padded = 0;     // per rank, summed over the steps
  int64_t micro_batches_packed = 0;
};

// costs: one per dataset record (index = position); recipe: sampler settings (seed,
// shuffle, group_by_length, batch.samples_per_rank); budgets: collate_budgets(recipe, ...)
// (its `packing` is ignored: both ways are planned). world >= 1.
PaddingEstimate estimate_padding(const std::vector<vlm::collate::SampleCost>& costs, const Recipe& recipe,
                                 vlm::collate::Budgets budgets, int64_t world);

}  // namespace vlm::app
