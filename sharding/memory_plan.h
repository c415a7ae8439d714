// Memory plan: bytes per rank of every unit's parameters, gradients and optimizer state
// under its sharding, for world size N (REFERENCE.md "Memory"; P = unit parameters,
// p = bytes of param_dtype, S(x) = ceil(P / N) * x: a rank's shard, padded to N equal parts):
//
//   layout          params   grads    optimizer (fp32 master* + m + v)
//   frozen          pP       0        0
//   frozen sharded  S(p)     0        0
//   replicated      pP       pP       (4* + 8) P
//   ZeRO-1          pP       pP       S(4* + 8)
//   ZeRO-2          pP       S(p)     S(4* + 8)
//   ZeRO-3          S(p)     S(p)     S(4* + 8)
//   * the fp32 master is separate only when param_dtype is not fp32 (else it is the param).
// With bf16 params: replicated 16P, ZeRO-1 4P + 12P/N, ZeRO-2 2P + 14P/N, ZeRO-3 16P/N.
// Transient memory (activations, one gathered FSDP unit + its two prefetched) is reported apart.
#pragma once
#include <string>
#include <vector>

#include "sharding/policy.h"

namespace vlm::sharding {

struct UnitMemory {
  double param_bytes = 0;  // per rank
  double grad_bytes = 0;
  double optim_bytes = 0;
  double total() const { return param_bytes + grad_bytes + optim_bytes; }
};

// Warnings below / above these sizes (a unit's parameter bytes in param_dtype).
constexpr double kTinyShardBytes = 1 << 20;               // sharding < 1 MiB buys nothing
constexpr double kGiantGatherBytes = 2.0 * (1ull << 30);  // > 2 GiB gathered at once

UnitMemory unit_memory(Sharding sharding, int64_t numel, int world_size, torch::Dtype param_dtype);

struct MemoryPlan {
  int world_size = 1;
  std::vector<UnitMemory> units;   // parallel to the unit table
  UnitMemory total;                // per rank
  double gathered_peak_bytes = 0;  // the three largest FSDP units (running unit + two prefetched)
  std::vector<std::string> warnings;
};

MemoryPlan plan_memory(const std::vector<UnitPlan>& units, int world_size, torch::Dtype param_dtype);

// "1.23 GiB", "512.0 KiB", "17 B".
std::string human_bytes(double bytes);

}  // namespace vlm::sharding
