// Sharded loading: a model built on the meta device gets real memory unit by unit, each
// rank allocating and reading only what it keeps (torchtitan's "build on meta, shard, then
// materialise"). No rank holds the whole model and nothing is broadcast: every rank reads
// its own ranges from the same source (mmap'd safetensors, or the seeded random init), so
// all ranks agree by construction.
//
//   auto units = resolve_units(model, opts);          // on the meta model
//   materialize_units(model, units, rank, world, device, dtype, source);
//   units = resolve_units(model, opts);               // handles of the real parameters
//   FsdpEngine(...)                                   // adopts the flat buffers below
//
// A sharded unit (full_shard, shard_grad_op, hybrid_shard, frozen_sharded) gets a flat
// buffer of [N*S] elements (S = ceil(numel / N), the FSDP engine's layout, fsdp.h) whose
// parameters are its consecutive slices. That buffer is laid out without memory
// (flat_buffer.h: released from the start, reads throw) and the FSDP engine adopts it as the
// gather buffer, so it takes memory only while the unit is gathered. The rank's [S] shard,
// elements [r*S, (r+1)*S) filled from the source (padding past numel zeroed), is the only
// device memory a sharded unit gets here, and the engine keeps it as its local shard. Any
// other unit gets each parameter whole (every rank keeps all of it). ep experts rows
// (policy.h) are not for this function: apply_expert_parallel reads them (expert_parallel.h). Start-up peak on the
// device: the shards plus the whole units (app/plan/memory_plan.h startup_peak_bytes).
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sharding/parallel/policy.h"
#include "vlm/io/param_source.h"

namespace vlm::sharding {

struct ShardedLoadStats {
  int64_t sharded_units = 0;      // units given a flat buffer with this rank's range filled
  int64_t whole_units = 0;        // units materialised whole
  int64_t elements_filled = 0;    // parameter elements written from the source on this rank
  uint64_t bytes_read = 0;        // source (checkpoint) bytes read by this rank
};

// Whether `s` keeps only a shard of the parameters between uses (FsdpEngine's units).
bool shards_params(Sharding s);

struct ShardedLoad {
  ShardedLoadStats stats;
  // Per sharded unit (path): this rank's [S] shard, filled (padding zeroed), for FsdpEngine.
  std::map<std::string, torch::Tensor> shards;
};

// Materialises every parameter of `units` (all on the meta device; resolved on `model`) on
// `device` in `dtype`, filling from `source` as described above. Parameters become new
// tensors: resolve the units again afterwards. Throws vlm::Error (from the source) naming
// the parameter and the file; the model is left partly materialised then (start-up fails).
// hybrid_shard units are sharded over their shard group: rank hybrid_rank of hybrid_size
// (ParallelDims' shard_rank(), dp_shard()); hybrid_size 0: over the world like the others.
ShardedLoad materialize_units(torch::nn::Module& model, const std::vector<UnitPlan>& units, int64_t rank,
                              int64_t world, torch::Device device, torch::Dtype dtype, vlm::ParamSource& source,
                              int64_t hybrid_rank = 0, int64_t hybrid_size = 0);

// Whether `params` are consecutive slices of one storage of exactly `flat_numel` elements
// starting at offset 0 (materialize_units' flat buffer), in order.
bool params_are_flat_slices(const std::vector<UnitParam>& params, int64_t flat_numel);

}  // namespace vlm::sharding
