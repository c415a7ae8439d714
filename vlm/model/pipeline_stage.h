// One pipeline stage of the composed model (pipeline parallelism: sharding/parallel/pipeline.h
// runs the schedule; this is what a stage holds and computes).
//
//   PipelineStage s = pipeline_stages(layer_costs, first_extra, last_extra, pp)[stage];
//   model->set_pipeline_stage(s);                    // before sharding: units of other stages stay on meta
//   auto out = model->forward_stage(batch, input);   // input: the previous stage's output
//
// Stage 0 holds the vision tower, the merger and the embedding (and, for Qwen3-VL, every layer
// that takes DeepStack features); the last stage the final norm and the head (a tied head: the
// embedding's weight, held by stage 0 and the last stage both, its gradient summed between
// them by sharding/). Every stage holds a contiguous run of decoder layers, at least one.
// Between stages flows the residual stream [B, L, d] in the activation dtype.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace vlm {

struct PipelineStage {
  int64_t index = 0;        // this stage
  int64_t count = 1;        // stages in all (1: no pipeline)
  int64_t first_layer = 0;  // decoder layers [first_layer, end_layer)
  int64_t end_layer = -1;   // -1: through the last layer
  bool first() const { return index == 0; }
  bool last() const { return index == count - 1; }
  bool whole() const { return count == 1; }
  // Whether this stage runs the unit `path` (VisionLanguageModelImpl::units()' names: visual.*,
  // model.embed_tokens, model.layers.N, model.norm, lm_head).
  bool runs(const std::string& path) const;
};

// The contiguous split of the decoder layers over `stages` stages that minimises the largest
// stage's cost: layer_costs[i] per layer, first_extra on stage 0 (vision tower, embedding),
// last_extra on the last stage (norm, head, loss); every stage gets at least one layer and stage 0
// at least min_first (DeepStack's layers). Throws when there are fewer layers than that.
std::vector<PipelineStage> pipeline_stages(const std::vector<double>& layer_costs, double first_extra,
                                           double last_extra, int64_t stages, int64_t min_first = 1);

// The fraction of a 1F1B step a stage idles: (p - 1) / (m + p - 1) for p stages, m micro-batches.
double pipeline_bubble(int64_t stages, int64_t micro_batches);

}  // namespace vlm
