// The statistics of one training step, summed over ranks with one all-reduce.
//
// Each rank fills a StepStats from its own micro-batches, packs it into one float64 tensor
// [kFields] (CPU), and the control plane sums the tensors in place (reduce_step_stats): the
// step's only all-reduce of statistics, and, through loss_sum, its only device -> host
// synchronisation. Every field is a sum over ranks, so the reduction is field-wise addition:
//
//   unpack(pack(a) + pack(b)) == a + b          (every field; integers exact below 2^53)
//
// Layout of the tensor (the order the trainer has always reduced them in):
//   [0] loss_sum  [1] samples  [2] images  [3] llm_tokens  [4] flops  [5] dropped
//   [6] stop_requests  [7] padding_tokens  [8] padding
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "sharding/dist/comm.h"

namespace vlm::app {

struct StepStats {
  static constexpr int64_t kFields = 9;

  double loss_sum = 0;         // sum of the token losses of the step's micro-batches (unscaled)
  int64_t samples = 0;         // real samples built
  int64_t images = 0;
  int64_t llm_tokens = 0;      // attention-mask tokens of the non-filler micro-batches
  double flops = 0;            // the step's FLOPs (FlopModel, app/plan/flop_model.h)
  int64_t dropped = 0;         // samples that failed to build
  int64_t stop_requests = 0;   // ranks that received SIGINT / SIGTERM (0 or 1 per rank)
  int64_t padding_tokens = 0;  // micro-batch tokens (collate::PaddingCount::tokens)
  int64_t padding = 0;         // padding among them (collate::PaddingCount::padding)

  // Some rank asked the run to stop (checkpoint, then leave the loop).
  bool stop() const { return stop_requests > 0; }

  // [kFields] float64 on the CPU, in the layout above.
  torch::Tensor pack() const;
  // Reads a tensor of pack()'s layout (any dtype convertible to float64, kFields elements);
  // throws vlm::Error naming the expected and actual shape otherwise.
  static StepStats unpack(const torch::Tensor& t);
};

// Collective (every rank, once per step): sums `local` over the ranks of `comm` with one
// all-reduce labelled "<ctx>, step statistics" and returns the global sums.
StepStats reduce_step_stats(vlm::sharding::Comm& comm, const StepStats& local, const std::string& ctx);

}  // namespace vlm::app
