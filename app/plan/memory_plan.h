// Memory plan: bytes per rank of every unit's parameters, gradients and optimizer state
// under its sharding, for world size N, counted as the engine allocates them (fsdp.h,
// ddp.h, optimizer.h). P = unit parameters, p = bytes of param_dtype, r = bytes of
// reduce_dtype, S(x) = ceil(P / N) * x: a rank's shard, padded to N equal parts.
//
// Persistent (held from apply_policies on):
//   layout          params   grads               optimizer (fp32 master* + m + v)
//   frozen          pP       0                   0
//   frozen sharded  S(p)     0                   0
//   replicated      pP       gP                  (4* + 8) P
//   ZeRO-1          pP       gP                  S(4* + 8)
//   ZeRO-2          S(p)     S(4)                S(4* + 8)
//   ZeRO-3          S(p)     S(4)                S(4* + 8)
//   ZeRO-3 hybrid   as ZeRO-3 with N = dp_shard (the unit's shard group; replicated across
//                   the world / dp_shard groups)
//   * the fp32 master is separate only when param_dtype is not fp32 (else it is the param).
//   replicated / ZeRO-1 grads, g = r when r > p, else p + r: the DDP bucket buffer (reduce
//   dtype, allocated once), in which gradients accumulate when reduce_dtype is wider than
//   param_dtype (bf16 params, fp32 reduce: no .grad is kept, ddp.h), plus otherwise the
//   parameter's .grad (param dtype). FSDP grads: the fp32 shard grad [S], whatever
//   param_dtype and reduce_dtype are (gradients accumulate there across micro-batches).
// Transient (during a step), reported apart:
//   gathered_peak_bytes        the flat buffers [N*S] x p gathered at once: every ZeRO-2
//                              unit (kept from its forward to its reduce-scatter) plus the
//                              three largest ZeRO-3 / frozen sharded units (running + two
//                              prefetched)
//   reduce_scatter_peak_bytes  the reduce-dtype buffers of the reduce-scatters in flight:
//                              input [N*S] + output [S] x r of the kMaxReduceScattersInFlight
//                              (2) largest trainable FSDP units (fsdp.h)
//   unsharded_accum_bytes      with accumulate_unsharded (sharding.fsdp_accumulate =
//                              "unsharded", fsdp.h): every trainable FSDP unit's unsharded
//                              gradient sum [N*S] x r, all alive from the end of the first
//                              micro-batch's backward until the last one's reduce-scatters
// Start-up (apply_policies, before step 1), reported apart:
//   startup_peak_bytes         with model.sharded_load (sharded_load.h): what the rank keeps,
//                              allocated unit by unit: the persistent bytes above; FSDP's
//                              gather buffers are laid out without memory, so nothing is
//                              transient. An upper bound: state first allocated at step 1
//                              is counted here but comes later
//   whole_load_peak_bytes      with model.sharded_load = false: every parameter whole in
//                              param dtype on every rank (loaded, then broadcast from rank 0)
//                              + the largest unit's [N*S] flat buffer built from it + the
//                              persistent bytes (an upper bound: the whole parameters of an
//                              FSDP unit are freed once its flat buffer holds them)
// Not counted: activations, the autograd .grad of an FSDP unit's parameters between its
// backward and its reduce-scatter (param dtype, one unit at a time), that of a DDP
// parameter between autograd's accumulation and the hook that folds it into the bucket
// (param dtype, one parameter at a time), Gloo's receive copy of
// a reduce-scatter input on CPU (comm.h), the caching allocator's slack.
// With bf16 params and fp32 reduce: replicated 18P, ZeRO-1 6P + 12P/N, ZeRO-2 and ZeRO-3
// 18P/N persistent (REFERENCE.md's 16P-family counts bf16 gradients, which this engine does
// not keep: FSDP and DDP gradients are fp32).
#pragma once
#include <string>
#include <vector>

#include "sharding/parallel/policy.h"

namespace vlm::app {


struct UnitMemory {
  double param_bytes = 0;  // per rank, persistent
  double grad_bytes = 0;
  double optim_bytes = 0;
  double total() const { return param_bytes + grad_bytes + optim_bytes; }
  double host_optim_bytes = 0;  // optimizer offload (plan_offload, offload.h): host memory
};

// Warnings below / above these sizes (a unit's parameter bytes in param_dtype).
constexpr double kTinyShardBytes = 1 << 20;               // sharding < 1 MiB buys nothing
constexpr double kGiantGatherBytes = 2.0 * (1ull << 30);  // > 2 GiB gathered at once

UnitMemory unit_memory(sharding::Sharding sharding, int64_t numel, int world_size, torch::Dtype param_dtype,
                       torch::Dtype reduce_dtype = torch::kFloat32);

struct MemoryPlan {
  int world_size = 1;
  int dp_shard = 1;                // ranks a hybrid_shard unit is split over (its shard group)
  std::vector<UnitMemory> units;   // parallel to the unit table
  UnitMemory total;                // per rank, persistent
  double gathered_peak_bytes = 0;        // see the header comment
  double reduce_scatter_peak_bytes = 0;  // see the header comment
  double unsharded_accum_bytes = 0;      // see the header comment
  double offload_saved_bytes = 0;  // device optimizer bytes moved to the host (plan_offload)
  double whole_params_bytes = 0;   // every parameter whole in param dtype (the unsharded model)
  double largest_flat_bytes = 0;   // the largest FSDP unit's [N*S] x p buffer
  // See the header comment (start-up); plan_offload keeps them consistent.
  double startup_peak_bytes() const { return total.total(); }
  double whole_load_peak_bytes() const { return whole_params_bytes + largest_flat_bytes + total.total(); }
  // The part of total.grad_bytes that exists only from a unit's backward until the
  // optimizer's zero_grad: a DDP parameter's .grad (param dtype) when gradients accumulate
  // in .grad (reduce dtype no wider than param dtype, ddp.h). app/plan/step_memory.h places it
  // in the step.
  double backward_grad_bytes = 0;
  // Persistent + the transient peaks (an upper bound on the step's sharding memory).
  double peak_bytes() const {
    return total.total() + gathered_peak_bytes + reduce_scatter_peak_bytes + unsharded_accum_bytes;
  }
  std::vector<std::string> warnings;
};

// dp_shard: the shard group size of hybrid_shard units (0: the world size).
MemoryPlan plan_memory(const std::vector<sharding::UnitPlan>& units, int world_size, torch::Dtype param_dtype,
                       torch::Dtype reduce_dtype = torch::kFloat32, bool accumulate_unsharded = false,
                       int dp_shard = 0);

// The plan with offload (units: the unit table `plan` was made from): every unit's device
// optimizer bytes move to host_optim_bytes, which count 16 B per state element (fp32
// master, m, v and grad staging; the elements: P for replicated units, S = ceil(P/N) for
// ZeRO-1 / FSDP units, N = dp_shard for hybrid_shard ones, as memory_plan.h);
// offload_saved_bytes = the device bytes moved.
void plan_offload(MemoryPlan& plan, const std::vector<sharding::UnitPlan>& units);

// "1.23 GiB", "512.0 KiB", "17 B".
std::string human_bytes(double bytes);

}  // namespace vlm::app
