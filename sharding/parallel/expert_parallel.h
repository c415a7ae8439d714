// Expert parallelism: each MoE layer's E experts split over the `ep` ranks of an EP group
// (ParallelDims::ep_comm(): ep consecutive ranks), tokens sent to the rank that holds their
// expert and back. The model knows nothing of it (vlm/model/moe.h): apply_expert_parallel
// narrows every sparse layer's `mlp.experts` to this rank's experts and installs the
// dispatcher, the seam MoeExpertsImpl::forward calls with its expert-sorted rows.
//
//   apply_expert_parallel(*model, dims);   // collective-free; before sharding / loading
//   apply_policies(*model, opts, dims);    // the `ep` rows: sharded_model.h
//
// Layout: H = E / ep experts per rank; EP rank q holds global experts [q*H, (q+1)*H)
// (MoeExpertsImpl::keep_experts). Ranks in the same position of different EP groups hold the
// same experts (the expert-replicate group, ParallelDims::expert_replicate_comm()), where
// their gradients are all-reduced (the experts' DDP reducer, sharded_model.cpp).
//
// One dispatch (per sparse layer, per forward; again when the layer is recomputed), on the
// EP group, n = ep ranks, rows [M, d] grouped by global expert, counts [E] int64:
//   1. counts all-to-all: counts seen as [n, H], row k to rank k -> recv [n, H] (recv[j, h]:
//      rows rank j sends for local expert h). Then ONE device-to-host read of [counts; recv]
//      (E + n*H int64): the host needs the split sizes of the row all-to-alls. On CUDA it
//      is a stream sync per sparse layer and forward (the price of dropless dispatch with
//      variable splits).
//   2. rows all-to-all: send_splits[k] = rows for rank k's experts, recv_splits[j] = rows
//      from rank j -> [R, d] ordered (source rank, local expert).
//   3. regroup by local expert (one index_select), experts.compute(rows, [H] counts), undo
//      the regrouping (index_select with the inverse permutation).
//   4. results all-to-all back with the splits swapped -> [M, d] in the caller's order.
// The row all-to-alls are autograd Functions whose backward is the reverse all-to-all of
// the gradient (on the same comm, in reverse order; every rank runs the same backward).
// Dropless: every row reaches its expert (no capacity factor).
// No-hang invariant (design.md, invariants 2 and 3): every rank of the EP group runs the
// three all-to-alls of every layer in layer order, also with no rows (M = 0) or with all
// rows for one expert; the backward runs the two reverse ones likewise (a zero-row rank
// still has the nodes in its graph).
//
// Bytes per dispatch on rank r (Comm counters, all_to_all): forward (n-1)*H*8 for the counts
// + sum_{k != r} send_splits[k] * d * b (rows) + sum_{j != r} recv_splits[j] * d * b
// (results), b = bytes per element; the backward the same two row terms again.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sharding/dist/comm.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_load.h"
#include "vlm/io/param_source.h"
#include "vlm/model/moe.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::sharding {

// Statistics of one dispatcher (this rank), for tests and logs.
struct ExpertDispatchStats {
  int64_t dispatches = 0;     // dispatch() calls (sparse layers x forwards, recomputes included)
  int64_t rows_sent = 0;      // rows sent to other ranks (forward row all-to-alls)
  int64_t rows_received = 0;  // rows received from other ranks
  int64_t rows_computed = 0;  // rows this rank's experts ran
};

class ExpertParallelDispatcher : public vlm::ExpertDispatcher {
 public:
  // comm: the EP group (n ranks, this rank = EP rank); num_experts: E, divisible by n.
  ExpertParallelDispatcher(Comm& comm, int64_t num_experts);
  // rows: [M, d] grouped by global expert; counts: [E] int64 -> [M, d] (see the header).
  torch::Tensor dispatch(vlm::MoeExpertsImpl& experts, const torch::Tensor& rows, const torch::Tensor& counts) override;
  const ExpertDispatchStats& stats() const { return stats_; }
  void reset_stats() { stats_ = ExpertDispatchStats{}; }
  // The context string of the next dispatches' comm ops ("step 3"); the layer is appended.
  void set_context(std::string ctx) { ctx_ = std::move(ctx); }

 private:
  Comm& comm_;
  int64_t num_experts_;
  int64_t held_;  // H = E / n
  ExpertDispatchStats stats_;
  std::string ctx_ = "expert dispatch";
};

// The sparse layers' experts of `model` (module path "model.language_model.layers.1.mlp.experts"
// style, as named_modules() gives it) in forward order.
std::vector<std::pair<std::string, vlm::MoeExpertsImpl*>> moe_experts(vlm::VisionLanguageModelImpl& model);

// Sharded loading of the experts (apply_policies with a ParamSource, sharded_load.h): each
// rank reads only its experts, flat elements [first * per, (first + H) * per) of every
// expert tensor (per = elements per expert: a contiguous run), into `device` / `dtype`.
struct ExpertLoad {
  vlm::ParamSource* source = nullptr;
  torch::Device device{torch::kCPU};
  torch::Dtype dtype = torch::kFloat32;
  ShardedLoadStats* stats = nullptr;  // elements_filled / whole_units / bytes_read added here
};

// Splits every sparse layer's experts over dims' EP group: keep_experts(ep_rank * E/ep,
// E/ep) and installs one dispatcher on all of them. Works on a materialised model (the
// held experts are copied out) or on the meta device; with `load` (the model on meta) the
// held experts are read from load->source BEFORE the split, while the parameters still
// have their full [E, ...] shape (a random-init source draws them in that shape, so every
// rank gets the single-process values), then installed. Throws vlm::Error when E % ep != 0
// or the model has no sparse layer. Local (no collective). Returns the dispatcher (null
// when dims.ep() == 1: nothing to do).
std::shared_ptr<ExpertParallelDispatcher> apply_expert_parallel(vlm::VisionLanguageModelImpl& model,
                                                                 const ParallelDims& dims,
                                                                 const ExpertLoad* load = nullptr);

}  // namespace vlm::sharding
