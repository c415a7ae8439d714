#include "app/plan/padding_estimate.h"

#include "data/sampler.h"
#include "vlm/runtime/check.h"

namespace vlm::app {

PaddingEstimate estimate_padding(const std::vector<vlm::collate::SampleCost>& costs, const Recipe& recipe,
                                 vlm::collate::Budgets budgets, int64_t world) {
  VLM_CHECK(world >= 1, "estimate_padding: world size must be >= 1, got ", world);
  PaddingEstimate e;
  if (costs.empty()) return e;
  vlm::data::SamplerOptions so;
  so.dataset_size = static_cast<int64_t>(costs.size());
  so.world_size = world;
  so.batch_per_rank = recipe.batch.samples_per_rank;
  so.seed = static_cast<uint64_t>(recipe.run.seed);
  so.shuffle = recipe.data.shuffle;
  so.group_by_length = recipe.data.group_by_length;
  if (so.group_by_length)
    for (const auto& c : costs) so.costs.push_back(c.text_tokens);  // as TrainData does
  vlm::data::DistributedSampler sampler(so);
  vlm::data::SamplerCursor c;
  const int64_t epoch = c.epoch;
  while (c.epoch == epoch) {
    std::vector<vlm::collate::SampleCost> step;
    vlm::data::SamplerCursor next = c;
    for (int64_t r = 0; r < world; ++r) {
      vlm::data::SamplerStep s = sampler.step(c, r);
      for (int64_t idx : s.indices) step.push_back(costs[static_cast<size_t>(idx)]);
      next = s.next;
    }
    for (bool packing : {false, true}) {
      budgets.packing = packing;
      const vlm::collate::StepPlan plan = vlm::collate::plan_step(step, static_cast<int>(world), budgets);
      (packing ? e.packed : e.padded) += vlm::collate::plan_padding(plan);
      (packing ? e.micro_batches_packed : e.micro_batches_padded) += plan.micro_batches;
    }
    ++e.steps;
    c = next;
  }
  return e;
}

}  // namespace vlm::app
