// Traffic plan: the bytes each rank moves per training step, per collective, per process
// group, and per link class (within a node / across nodes), counted as the engines issue
// them (fsdp.h, ddp.h, optimizer.h) in Comm's logical ring volumes (comm.h), so a run's
// measured counters can be held against it (tests/sharding/parallel/hybrid_dist_test.cpp).
//
// Names: N a group's size, S = ceil(P / N), p / r bytes of param_dtype / reduce_dtype, K
// micro-batches per step.
//   fsdp unit (full_shard, hybrid_shard, frozen sharded; N = its group: the world, or the
//   shard group for hybrid_shard), per micro-batch and per call of the unit in the model's
//   call order: all-gather (N-1)/N x N*S x p before its forward, and, trainable units, once
//   more before its backward, except the last FSDP call of the forward (kept gathered, fsdp.h).
//   A frozen sharded unit is counted with its forward gather only (no backward runs through
//   a frozen tower below every trained unit). shard_grad_op: one gather per micro-batch.
//   reduce-scatter (N-1)/N x N*S x r: per micro-batch, or once per step with
//   fsdp_accumulate = "unsharded".
//   hybrid_shard replicas (R = world / dp_shard > 1): one all-reduce 2(R-1)/R x S x 4 per
//   step (the fp32 shard grad, on the synced micro-batch).
//   replicated / ZeRO-1 trainable unit: one bucket all-reduce 2(N-1)/N x P x r per step
//   (no_sync before the last micro-batch); ZeRO-1 also all-gathers (N-1)/N x N*S x p after
//   the update.
//   ep experts row (<unit>+experts, P = the held experts): the same over its expert-replicate
//   group (N = world / ep, the ranks holding the same experts): the all-reduce, and with
//   N > 1 the all-gather of the ZeRO-1 update (optimizer.h). The all-to-alls of the token
//   dispatch depend on routing and are not in the plan (`vlmtrain plan` prints them beside it).
// Groups and link classes: ranks fill the nodes in order, local_world consecutive ranks per
// node (torchrun, Slurm). The world group spans nodes when world > local_world; a shard
// group (dp_shard consecutive ranks) stays within a node when dp_shard divides local_world;
// a replicate group (every dp_shard-th rank) and an expert-replicate group (every ep-th rank)
// span nodes when world > local_world and they have more than one rank. A
// collective over a group that spans nodes is counted whole as inter-node: its ring runs at
// the pace of the slowest link. Not counted: the control plane (a few scalars per step),
// the start-up broadcast, checkpoint and eval traffic.
#pragma once
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sharding/parallel/policy.h"

namespace vlm::app {


// Where the ranks are: world size, hybrid_shard's shard group size (0: the world), ranks per node.
struct MeshShape {
  int world = 1;
  int dp_shard = 0;
  int local_world = 1;
  int shard() const { return dp_shard > 0 ? dp_shard : world; }
  int replicate() const { return world / shard(); }
};

enum class CommGroup { kWorld, kShard, kReplicate, kExpertReplicate };
const char* comm_group_name(CommGroup g);  // "world", "shard", "replicate", "expert_replicate"

// One kind of collective of one unit.
struct PlannedOp {
  std::string unit;
  std::string op;        // "all_gather", "reduce_scatter", "all_reduce"
  CommGroup group = CommGroup::kWorld;
  bool inter_node = false;
  double bytes = 0;      // per op and rank (ring volume)
  int per_micro_batch = 0;  // issued this many times in every micro-batch
  int per_step = 0;         // and this many times once per step
  double step_bytes(int micro_batches) const { return bytes * (per_micro_batch * micro_batches + per_step); }
};

struct TrafficPlan {
  MeshShape mesh;
  std::vector<PlannedOp> ops;
  // Bytes per rank in one step of `micro_batches` micro-batches.
  double intra_node_bytes(int micro_batches) const;
  double inter_node_bytes(int micro_batches) const;
  double group_bytes(CommGroup g, int micro_batches) const;
  // Whether group `g` spans more than one node under `mesh`.
  static bool spans_nodes(const MeshShape& mesh, CommGroup g);
};

// call_order: the model's unit calls in forward order (path, owning unit path), as
// FsdpEngine takes them (VisionLanguageModelImpl::units()). no_backward_gather: the calls
// FSDP does not re-gather for backward (sharding::calls_without_backward_gather).
TrafficPlan plan_traffic(const std::vector<sharding::UnitPlan>& units,
                         const std::vector<std::pair<std::string, std::string>>& call_order, const MeshShape& mesh,
                         torch::Dtype param_dtype, torch::Dtype reduce_dtype, bool accumulate_unsharded,
                         const std::set<std::string>& no_backward_gather = {});

}  // namespace vlm::app
