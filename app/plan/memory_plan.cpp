// Memory plan (see memory_plan.h for the table of formulas).
#include "app/plan/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "sharding/parallel/fsdp.h"
#include "vlm/runtime/check.h"

namespace vlm::app {

using sharding::Sharding;
using sharding::UnitPlan;

UnitMemory unit_memory(Sharding sharding, int64_t numel, int world_size, torch::Dtype param_dtype,
                       torch::Dtype reduce_dtype) {
  VLM_CHECK(world_size >= 1, "memory plan: world size must be >= 1, got ", world_size);
  const double p = static_cast<double>(c10::elementSize(param_dtype));
  const double r = static_cast<double>(c10::elementSize(reduce_dtype));
  const double full = static_cast<double>(numel);
  const double shard = static_cast<double>((numel + world_size - 1) / world_size);
  const double optim_per_elem = (param_dtype == torch::kFloat32 ? 0.0 : 4.0) + 8.0;
  // DDP gradients per element: the bucket buffer (r), plus the .grad (p) unless they
  // accumulate in the bucket (reduce dtype wider than param dtype, ddp.h).
  const double ddp_grad = r > p ? r : p + r;
  UnitMemory m;
  switch (sharding) {
    case Sharding::kFrozen: m.param_bytes = p * full; break;
    case Sharding::kFrozenSharded:
    case Sharding::kFrozenHybrid: m.param_bytes = p * shard; break;
    case Sharding::kReplicated: m = {p * full, ddp_grad * full, optim_per_elem * full}; break;
    // ep experts: replicated over their group (world_size: its size), their AdamW state
    // ZeRO-1 over it; numel is what the row holds (E / ep experts: apply_expert_parallel, or
    // `vlmtrain plan` splitting its meta model the same way)
    case Sharding::kExpert: m = {p * full, ddp_grad * full, optim_per_elem * shard}; break;
    case Sharding::kShardOptimizer: m = {p * full, ddp_grad * full, optim_per_elem * shard}; break;
    case Sharding::kShardGradOp:
    case Sharding::kHybridShard:
    case Sharding::kFullShard: m = {p * shard, 4.0 * shard, optim_per_elem * shard}; break;
  }
  return m;
}

namespace {
// Sum of the k largest values.
double largest(std::vector<double> v, size_t k) {
  std::sort(v.rbegin(), v.rend());
  double sum = 0;
  for (size_t i = 0; i < v.size() && i < k; ++i) sum += v[i];
  return sum;
}
}  // namespace

MemoryPlan plan_memory(const std::vector<UnitPlan>& units, int world_size, torch::Dtype param_dtype,
                       torch::Dtype reduce_dtype, bool accumulate_unsharded, int dp_shard) {
  MemoryPlan plan;
  plan.world_size = world_size;
  plan.dp_shard = dp_shard > 0 ? dp_shard : world_size;
  VLM_CHECK(plan.dp_shard <= world_size && world_size % plan.dp_shard == 0, "memory plan: dp_shard ", plan.dp_shard,
            " does not divide the world size ", world_size);
  const double p = static_cast<double>(c10::elementSize(param_dtype));
  const double r = static_cast<double>(c10::elementSize(reduce_dtype));
  std::vector<double> regathered, reduce_scattered;  // per unit: [N*S] x p, ([N*S] + [S]) x r
  for (const auto& u : units) {
    // The ranks the unit is split over: its shard group under hybrid_shard, else the world.
    const bool in_groups = u.sharding == Sharding::kHybridShard || u.sharding == Sharding::kFrozenHybrid;
    int n = in_groups ? plan.dp_shard : world_size;
    if (u.sharding == Sharding::kExpert && !u.params.empty()) {  // the expert-replicate group: world / ep
      const sharding::UnitParam& e = u.params.front();
      const int64_t ep = e.source_numel > 0 ? e.source_numel / std::max<int64_t>(1, e.param.numel()) : 1;
      n = static_cast<int>(std::max<int64_t>(1, world_size / std::max<int64_t>(1, ep)));
    }
    UnitMemory m = unit_memory(u.sharding, u.numel, n, param_dtype, reduce_dtype);
    plan.units.push_back(m);
    plan.total.param_bytes += m.param_bytes;
    plan.total.grad_bytes += m.grad_bytes;
    plan.total.optim_bytes += m.optim_bytes;
    const double bytes = p * static_cast<double>(u.numel);
    const bool ddp_grad = u.sharding == Sharding::kReplicated || u.sharding == Sharding::kShardOptimizer;
    if (ddp_grad && r <= p) plan.backward_grad_bytes += bytes;  // the .grad beside the bucket
    const double shard = static_cast<double>((u.numel + n - 1) / n);
    const double flat = shard * n;  // [N*S]
    const bool sharded_params = u.sharding == Sharding::kFullShard || u.sharding == Sharding::kHybridShard ||
                                u.sharding == Sharding::kFrozenSharded || u.sharding == Sharding::kFrozenHybrid;
    const bool fsdp = sharded_params || u.sharding == Sharding::kShardGradOp;
    plan.whole_params_bytes += bytes;
    if (fsdp) plan.largest_flat_bytes = std::max(plan.largest_flat_bytes, p * flat);
    const bool sharded_any = fsdp || u.sharding == Sharding::kShardOptimizer;
    if (sharded_params) regathered.push_back(p * flat);
    if (u.sharding == Sharding::kShardGradOp) plan.gathered_peak_bytes += p * flat;  // all held at once
    if (fsdp && u.trainable()) reduce_scattered.push_back(r * (flat + shard));
    if (fsdp && u.trainable() && accumulate_unsharded) plan.unsharded_accum_bytes += r * flat;
    if (n > 1 && sharded_any && bytes < kTinyShardBytes)
      plan.warnings.push_back(str("unit ", u.path, " is tiny (", human_bytes(bytes), ") but sharded (",
                                  sharding_name(u.sharding), "): the collectives cost more than the memory "
                                  "saved (hint: policy = \"ddp\")"));
    if (bytes > kGiantGatherBytes)
      plan.warnings.push_back(str("unit ", u.path, " is giant (", human_bytes(bytes), ") and ",
                                  fsdp ? "gathered whole for forward" : "held whole on every rank",
                                  " (hint: split it into smaller units)"));
  }
  // FSDP gathers the running unit and prefetches the next two (fsdp.h): the three largest.
  plan.gathered_peak_bytes += largest(regathered, 3);
  plan.reduce_scatter_peak_bytes = largest(reduce_scattered, sharding::kMaxReduceScattersInFlight);
  return plan;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024 && i < 4) {
    bytes /= 1024;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, i == 0 ? "%.0f %s" : "%.2f %s", bytes, units[i]);
  return buf;
}

void plan_offload(MemoryPlan& plan, const std::vector<UnitPlan>& units) {
  VLM_CHECK(plan.units.size() == units.size(), "plan_offload: the plan has ", plan.units.size(),
            " units, the unit table ", units.size(), " (hint: pass the table the plan was made from)");
  for (size_t i = 0; i < units.size(); ++i) {
    const UnitPlan& u = units[i];
    UnitMemory& m = plan.units[i];
    if (!u.trainable()) continue;
    // The ranks the unit is split over: its shard group under hybrid_shard, else the world.
    const int64_t n = u.sharding == Sharding::kHybridShard ? plan.dp_shard : plan.world_size;
    const int64_t elems = u.sharding == Sharding::kReplicated ? u.numel : (u.numel + n - 1) / n;
    m.host_optim_bytes = 16.0 * static_cast<double>(elems);
    plan.total.host_optim_bytes += m.host_optim_bytes;
    plan.offload_saved_bytes += m.optim_bytes;
    plan.total.optim_bytes -= m.optim_bytes;
    m.optim_bytes = 0;
  }
}

}  // namespace vlm::app
