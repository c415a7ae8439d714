// Pipeline parallelism: the world's pp stages (ParallelDims::pp(), the outermost dimension) each
// hold a contiguous run of the decoder layers (vlm/model/pipeline_stage.h: stage 0 also the
// vision tower and the embedding, the last stage the norm, the head and the loss) and run a
// step's micro-batches in Megatron's non-interleaved 1F1B order, passing the residual stream
// [B, L, d] forward and its gradient back to the rank with the same stage index in the
// neighbouring stage.
//
//   vlm::PipelineStage s = apply_pipeline_parallel(model, dims);  // before apply_policies
//   auto sm = apply_policies(model, opts, dims, source);           // this stage's units only
//   PipelineSchedule pipe(dims, model.cfg.text.hidden_size, act_dtype);
//   pipe.run({m, fwd, before_backward, after_backward}, ctx);      // per step
//
// Stages: pipeline_split() balances the layers by a per-unit cost (pipeline_unit_costs: the
// parameters a token meets, i.e. FLOPs per token up to a factor: a sparse layer's experts
// count top-k / E, the vision tower as if one patch per token, the head d x V; under tensor
// parallelism the rank's slices: the layers' and the head's split, the tower whole). Units of other
// stages are never materialised (apply_policies keeps this stage's rows: keep_stage_units).
// A tied head: stage 0 and the last stage both hold model.embed_tokens.weight; the optimizer
// sums its gradient over ParallelDims::pp_tie() and both apply the same update
// (ShardedAdamW::add_shared_gradients), counted once in the gradient norm.
//
// Schedule per stage s of p, m micro-batches (the same m on every stage, invariant 1):
//   warm-up   w = min(p - 1 - s, m) times: recv forward, F, send forward
//   steady    m - w times: F, send forward + recv backward, B, send backward + recv forward
//             (the last: send backward only), after one recv forward before the first
//   cool-down w times: recv backward, B, send backward
// Each exchange is one 2-rank all_to_all on the link's own group (pp_prev / pp_next), carrying
// what each side sends (either may be empty): on every link both sides issue the same sequence
// of exchanges (warm-up sends meet warm-up receives, the steady pairs meet each other), so no
// rank waits on an op its peer does not issue. Shapes come from the host batch (the receiver
// knows B and L of micro-batch k): no size exchange, no host sync.
// Backward of micro-batch k runs in order k = 0 .. m - 1: before_backward(k) can set_sync(k ==
// m - 1). The last stage's forward returns the scaled loss (backward from it); the others
// backward their output with the received gradient. The first stage sends nothing back.
// Bytes per micro-batch on each link: B x L x d x b forward and the same backward. Under
// tensor parallelism each tp rank passes its sequence chunk [B, L / tp, d] (L padded to a
// multiple of tp) to the same tp rank of the next stage: the stream crosses once in all, with
// no gather at the boundary (Megatron's scatter / gather of the pipeline exchange).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "sharding/dist/comm.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/policy.h"
#include "vlm/model/pipeline_stage.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::sharding {

// Per decoder layer its cost, and the first / last stage's extra (see the header comment).
struct PipelineCosts {
  std::vector<double> layers;
  double first = 0, last = 0;
};
PipelineCosts pipeline_unit_costs(vlm::VisionLanguageModelImpl& model);
// The balanced stages of `model` over pp (stage 0 holding the DeepStack layers).
std::vector<vlm::PipelineStage> pipeline_split(vlm::VisionLanguageModelImpl& model, int64_t pp);

// Sets this rank's stage (dims.pp_rank() of pipeline_split(model, dims.pp())) on the model and
// returns it. pp 1: nothing (the whole model).
vlm::PipelineStage apply_pipeline_parallel(vlm::VisionLanguageModelImpl& model, ParallelDims& dims);

// The rows of `units` the stage runs: by path or alias (a tied head's embedding row on stage 0
// and the last), LoRA and expert rows with their unit.
std::vector<UnitPlan> keep_stage_units(const std::vector<UnitPlan>& units, const vlm::PipelineStage& stage);

// One step's work for the schedule.
struct PipelineStep {
  int64_t micro_batches = 0;
  // [B, L] of micro-batch k (the residual stream is [B, L, d]).
  std::function<std::pair<int64_t, int64_t>(int64_t k)> rows_and_length;
  // Forward of micro-batch k: input the received activation (undefined on stage 0, requires
  // grad elsewhere). Returns the activation to send (not the last stage) or the scaled loss
  // scalar to backward from (the last stage).
  std::function<torch::Tensor(int64_t k, const torch::Tensor& input)> forward;
  std::function<void(int64_t k)> before_backward;  // e.g. set_sync(k == m - 1)
  std::function<void(int64_t k)> after_backward;   // e.g. finish_backward
};

class PipelineSchedule {
 public:
  // hidden: d; dtype / device of the residual stream.
  PipelineSchedule(ParallelDims& dims, int64_t hidden, torch::TensorOptions act);
  void run(const PipelineStep& step, const std::string& ctx);
  // Bytes this rank sent on its links in the last run (forward activations, backward gradients).
  double sent_bytes() const { return sent_bytes_; }

 private:
  struct Slot {
    torch::Tensor input, output;  // the stage's input (requires grad) and output of micro-batch k
  };
  // One exchange on a link: send `out` (may be undefined), receive `in_shape` elements when
  // `recv` (else nothing); returns the received tensor.
  torch::Tensor exchange(Comm& link, bool earlier, const torch::Tensor& send, bool recv, int64_t k,
                         const std::string& what);
  std::vector<int64_t> shape(int64_t k) const;
  void forward(int64_t k, const std::string& ctx);
  void backward(int64_t k, const torch::Tensor& grad, const std::string& ctx);

  ParallelDims& dims_;
  int64_t hidden_;
  torch::TensorOptions act_;
  int64_t stage_ = 0, stages_ = 1;
  const PipelineStep* step_ = nullptr;
  std::vector<Slot> slots_;
  double sent_bytes_ = 0;
};

}  // namespace vlm::sharding
