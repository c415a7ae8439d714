// Traffic plan (see traffic_plan.h for the counting rules).
#include "app/plan/traffic_plan.h"

#include <algorithm>
#include <cmath>

#include "sharding/parallel/sharded_load.h"
#include "vlm/runtime/check.h"

namespace vlm::app {

using sharding::Sharding;
using sharding::UnitPlan;

const char* comm_group_name(CommGroup g) {
  switch (g) {
    case CommGroup::kWorld: return "world";
    case CommGroup::kShard: return "shard";
    case CommGroup::kReplicate: return "replicate";
    case CommGroup::kExpertReplicate: return "expert_replicate";
  }
  return "?";
}

bool TrafficPlan::spans_nodes(const MeshShape& mesh, CommGroup g) {
  const bool one_node = mesh.world <= mesh.local_world;
  if (one_node) return false;
  switch (g) {
    case CommGroup::kWorld: return true;
    case CommGroup::kReplicate: return mesh.replicate() > 1;  // every dp_shard-th rank: across the nodes
    case CommGroup::kShard: return mesh.local_world % mesh.shard() != 0;
    case CommGroup::kExpertReplicate: return true;  // every ep-th rank (planned only when it has > 1)
  }
  return true;
}

double TrafficPlan::intra_node_bytes(int micro_batches) const {
  double sum = 0;
  for (const auto& o : ops)
    if (!o.inter_node) sum += o.step_bytes(micro_batches);
  return sum;
}

double TrafficPlan::inter_node_bytes(int micro_batches) const {
  double sum = 0;
  for (const auto& o : ops)
    if (o.inter_node) sum += o.step_bytes(micro_batches);
  return sum;
}

double TrafficPlan::group_bytes(CommGroup g, int micro_batches) const {
  double sum = 0;
  for (const auto& o : ops)
    if (o.group == g) sum += o.step_bytes(micro_batches);
  return sum;
}

TrafficPlan plan_traffic(const std::vector<UnitPlan>& units,
                         const std::vector<std::pair<std::string, std::string>>& call_order, const MeshShape& mesh,
                         torch::Dtype param_dtype, torch::Dtype reduce_dtype, bool accumulate_unsharded,
                         const std::set<std::string>& no_backward_gather) {
  VLM_CHECK(mesh.world >= 1 && mesh.local_world >= 1 && mesh.shard() <= mesh.world && mesh.world % mesh.shard() == 0,
            "traffic plan: dp_shard ", mesh.shard(), " does not divide the world size ", mesh.world);
  TrafficPlan plan;
  plan.mesh = mesh;
  const double p = static_cast<double>(c10::elementSize(param_dtype));
  const double r = static_cast<double>(c10::elementSize(reduce_dtype));
  // The last call position whose unit is FSDP-sharded (kept gathered from forward to backward).
  int64_t last_pos = -1;
  for (size_t i = 0; i < call_order.size(); ++i)
    for (const auto& u : units)
      if (u.path == call_order[i].second && shards_params(u.sharding)) last_pos = static_cast<int64_t>(i);
  auto add = [&](const UnitPlan& u, const char* op, CommGroup g, double bytes, int per_mb, int per_step) {
    if (bytes <= 0 || (per_mb == 0 && per_step == 0)) return;
    plan.ops.push_back({u.path, op, g, TrafficPlan::spans_nodes(mesh, g), bytes, per_mb, per_step});
  };
  for (const auto& u : units) {
    const bool hybrid = u.sharding == Sharding::kHybridShard || u.sharding == Sharding::kFrozenHybrid;
    const CommGroup g = hybrid ? CommGroup::kShard : CommGroup::kWorld;
    const double n = hybrid ? mesh.shard() : mesh.world;
    const double shard = static_cast<double>((u.numel + static_cast<int64_t>(n) - 1) / static_cast<int64_t>(n));
    const double ring = (n - 1) / n;  // one pass of a ring over the group
    const double numel = static_cast<double>(u.numel);
    if (shards_params(u.sharding)) {
      int gathers = 0;
      for (size_t i = 0; i < call_order.size(); ++i) {
        if (call_order[i].second != u.path) continue;
        gathers += 1;  // forward
        if (u.trainable() && u.sharding != Sharding::kShardGradOp && static_cast<int64_t>(i) != last_pos &&
            !no_backward_gather.count(call_order[i].first))
          gathers += 1;  // re-gathered for backward
      }
      if (u.sharding == Sharding::kShardGradOp) gathers = std::min(gathers, 1);
      add(u, "all_gather", g, ring * n * shard * p, gathers, 0);
      if (u.trainable()) {
        add(u, "reduce_scatter", g, ring * n * shard * r, accumulate_unsharded ? 0 : 1, accumulate_unsharded ? 1 : 0);
        const double reps = mesh.replicate();
        if (hybrid && reps > 1) add(u, "all_reduce", CommGroup::kReplicate, 2 * (reps - 1) / reps * shard * 4, 0, 1);
      }
      continue;
    }
    if (!u.trainable()) continue;
    if (u.sharding == Sharding::kExpert) {  // over the ranks holding the same experts: world / ep
      const sharding::UnitParam& e = u.params.front();
      const int64_t ep = e.source_numel > 0 ? e.source_numel / std::max<int64_t>(1, e.param.numel()) : 1;
      const double reps = static_cast<double>(std::max<int64_t>(1, mesh.world / std::max<int64_t>(1, ep)));
      const double s = std::ceil(numel / reps);
      add(u, "all_reduce", CommGroup::kExpertReplicate, 2 * (reps - 1) / reps * numel * r, 0, 1);
      add(u, "all_gather", CommGroup::kExpertReplicate, (reps - 1) / reps * reps * s * p, 0, 1);
      continue;
    }
    const double world = mesh.world;
    add(u, "all_reduce", CommGroup::kWorld, 2 * (world - 1) / world * numel * r, 0, 1);
    if (u.sharding == Sharding::kShardOptimizer) {
      const double s = static_cast<double>((u.numel + mesh.world - 1) / mesh.world);
      add(u, "all_gather", CommGroup::kWorld, (world - 1) / world * world * s * p, 0, 1);
    }
  }
  return plan;
}

}  // namespace vlm::app
