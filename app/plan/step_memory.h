// The planned peak of a rank's device memory over one training step, next to which the step
// log prints the measured one: `plan` for the recipe's largest micro-batch, the trainer for
// the micro-batches it really runs.
//
//   peak = persistent (params, optimizer state, DDP buckets, FSDP shard grads:
//          app/plan/memory_plan.h; on the CPU also the offloaded optimizer state and the
//          loader's window of decoded samples, the host being the device)
//        + the step's inputs on the device (all its micro-batches are staged at once)
//        + the largest of three moments:
//          the loss's backward: gathered units + the forward's activations and the head's
//            transients (app/plan/activation_memory.h, checkpointed units as the policy table
//            says); no unit has reduced yet
//          a unit's backward: gathered units + reduce-scatter buffers in flight + what the
//            units before it keep and its own (recomputed) set and working set
//          both + the largest trainable unit's parameter gradient in param_dtype (autograd's
//            .grad before the engine folds it into a bucket or reduce-scatters it) and, with
//            several micro-batches, the gradients accumulating across them
//          the end of backward: the reduce-scatter buffers and the step's gradients (DDP
//            .grad in param dtype, FSDP unsharded sums), activations gone
//        + on CUDA the cuBLAS and cuBLASLt workspaces of the compute stream, allocated through
//          the caching allocator at the first matmul and kept: PyTorch keys them by (handle,
//          stream) and gives each thread its own handle, so the forward's thread and
//          autograd's device thread hold a pair each (kTrainingBlasWorkspaces x
//          (cublas_workspace_bytes + cublaslt_workspace_bytes); on an H200 with PyTorch 2.11,
//          DeviceMemory::blas_workspaces measured 3 (65 MiB), 4 (66 MiB) with checkpointing)
//
// Pipeline parallelism (the model's set_pipeline_stage): the activations are the stage's
// (activation_memory.h), and 1F1B keeps min(pp - s, micro-batches) of them alive on stage s
// at once: the moments above add the forward's end of the others in flight, each counted at
// the size of the micro-batch whose moment it is.
//
// Peaks of parts that need not coincide are added, so the plan leans high; the bench row
// (scripts/bench/memory_plan.py) measures how close it comes for each policy mix.
#pragma once
#include <algorithm>
#include <vector>

#include "collate/micro_batch.h"
#include "app/plan/memory_plan.h"
#include "sharding/parallel/policy.h"
#include "app/plan/activation_memory.h"

namespace vlm::app {

struct StepMemory {
  double persistent = 0;   // params, optimizer state, gradient buffers (+ the CPU's host parts)
  double inputs = 0;       // the step's micro-batches on the device
  double gathered = 0;     // gathered units (running + prefetched)
  double reduce = 0;       // reduce-scatter buffers in flight
  double act_head = 0;     // the largest micro-batch's activations through the loss's backward
  double act_units = 0;    // ... and through the largest unit backward
  double grads = 0;        // the largest unit's parameter gradient in param_dtype
  double step_grads = 0;   // gradients alive until the optimizer: DDP .grad, FSDP unsharded sums
  double workspace = 0;     // CUDA: the cuBLAS / cuBLASLt workspaces (training_blas_workspace_bytes)
  int64_t micro_batches = 1;
  int64_t in_flight = 1;   // pipeline: micro-batches whose activations are alive at once
  double activations() const { return std::max(act_head, act_units); }
  double total() const {
    const double accumulating = micro_batches > 1 ? step_grads : 0.0;
    const double head = gathered + act_head, units = gathered + reduce + act_units;
    return persistent + inputs + workspace +
           std::max(std::max(head, units) + grads + accumulating, reduce + step_grads);
  }
};

// Bytes of the cuBLAS workspace PyTorch gives a stream's handle on a GPU of compute
// capability `sm_major`: CUBLAS_WORKSPACE_CONFIG when set (":SIZE_KiB:COUNT" pairs, summed),
// else PyTorch's default: 4096 KiB x 8 = 32 MiB from Hopper (9.x) on, 4096 x 2 + 16 x 8 KiB
// = 8.125 MiB before. cuBLASLt shares it.
double cublas_workspace_bytes(int sm_major = 9);
// Bytes of the cuBLASLt workspace beside it: CUBLASLT_WORKSPACE_SIZE (KiB) when set, else
// 1024 KiB (PyTorch 2.11's default, measured on an H200); 0 with TORCH_CUBLASLT_UNIFIED_WORKSPACE=1
// (cuBLASLt then uses the cuBLAS workspace).
double cublaslt_workspace_bytes();
// Threads whose handles hold workspaces in a training step on CUDA: the forward's and
// autograd's device thread (the backward's).
constexpr int kTrainingBlasWorkspaces = 2;
// kTrainingBlasWorkspaces x (cublas_workspace_bytes + cublaslt_workspace_bytes).
double training_blas_workspace_bytes(int sm_major = 9);

class StepMemoryModel {
 public:
  // model: after the policies (requires_grad and adapters as they train); plan: its memory
  // plan; units: the unit table (activation checkpointing per unit); prefetch_samples: the
  // loader's window (data.prefetch x batch.samples_per_rank), counted on the CPU only.
  StepMemoryModel(vlm::VisionLanguageModelImpl& model, const vlm::app::MemoryPlan& plan,
                  const std::vector<vlm::sharding::UnitPlan>& units, torch::Dtype param_dtype,
                  vlm::app::AttentionPath path, int64_t prefetch_samples);

  // The CUDA workspace term (default: training_blas_workspace_bytes() with path cuda, 0 on
  // the CPU); the trainer sets its GPU's.
  void set_workspace(double bytes) { workspace_ = bytes; }
  // Context parallelism (dist.cp): the micro-batches' decoders run on chunks of L / cp tokens.
  void set_context_parallel(int64_t cp, bool ring = false) { cp_ = cp, cp_ring_ = ring; }

  // A step of these micro-batches.
  StepMemory step(const std::vector<vlm::collate::MicroBatch>& micro_batches) const;
  // A step of `count` micro-batches of this shape holding `samples` samples in all (plan:
  // the recipe's budget).
  StepMemory step(const vlm::app::MicroBatchShape& shape, int64_t count, int64_t samples) const;

  // Bytes of one micro-batch's tensors: ids, labels, mask [B, L] int64, positions [3, B, L]
  // int64, pixel_values [P, patch_dim] in param_dtype, loss rows.
  double input_bytes(const vlm::app::MicroBatchShape& shape) const;
  static vlm::app::MicroBatchShape shape_of(const vlm::collate::MicroBatch& mb);

 private:
  // The step's parts that do not depend on its micro-batches.
  StepMemory base(int64_t micro_batches) const;
  // Adds one micro-batch's activation peaks (loss, units) to m's maxima, with the forward's
  // end of m.in_flight - 1 others like it alive beside it.
  void add_activations(StepMemory& m, const vlm::app::MicroBatchShape& shape) const;
  // The CPU's loader window: prefetch_samples decoded samples, at the step's bytes per sample.
  void add_loader_window(StepMemory& m, int64_t samples) const;

  vlm::VisionLanguageModelImpl* model_;
  torch::Dtype dtype_;
  double workspace_ = 0;
  vlm::app::AttentionPath path_;
  std::vector<std::string> checkpointed_;
  double persistent_ = 0, gathered_ = 0, reduce_ = 0, grads_ = 0, step_grads_ = 0;
  int64_t prefetch_samples_ = 0;
  int64_t cp_ = 1;
  bool cp_ring_ = false;  // cp in ring mode (MicroBatchShape::cp_ring)
};

}  // namespace vlm::app
