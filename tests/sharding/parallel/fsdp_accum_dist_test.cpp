// FSDP gradient accumulation without a reduce-scatter per micro-batch
// (ShardingOptions::fsdp_accumulate_unsharded, fsdp.h), helpers in fsdp_testing.h.
//
// Three micro-batches per step, world 2 and world 1, fp32:
//   - losses and final parameters equal the single-process reference (1e-5 relative loss,
//     1e-5 absolute parameters), for frozen-vision full_shard (frozen sharded vision, DDP
//     merger, full_shard LLM) and all-fsdp shard_grad_op (vision trained too);
//   - traffic of step 1: one reduce-scatter per trainable FSDP unit, where the sharded mode
//     (same run, option off) issues one per unit and micro-batch, so the reduce-scatter
//     bytes are 1/3 of its;
//   - traffic: step 1's bytes on the data plane equal the traffic plan (traffic_plan.h) in
//     both modes;
//   - memory: the engine's peak of unsharded accumulators equals the plan's
//     unsharded_accum_bytes (every trainable FSDP unit's [N*S] x 4 B), and is 0 when off.
#include <gtest/gtest.h>

#include "app/plan/memory_plan.h"
#include "app/plan/traffic_plan.h"
#include "tests/sharding/parallel/fsdp_testing.h"

namespace {

using namespace vlm::sharding;
using namespace vlm::app;  // the cost models (app/plan/)
using namespace fsdp_testing;

void check_unsharded_accumulation(ParallelDims& dims) {
  const int n = dims.world_size();
  for (const char* strategy : {"full_shard", "shard_grad_op"}) {
    Config c;
    c.strategy = strategy;
    c.frozen_vision = c.strategy == "full_shard";
    c.accum = 3;
    c.end = 3;
    const RunResult want = reference_run(c, n);
    Config sharded = c;
    const RunResult base = sharded_run(dims, sharded);
    c.unsharded_accum = true;
    const RunResult got = sharded_run(dims, c);
    const std::string tag = rank_tag(dims, c);
    compare(got, want, tag);
    compare(base, want, rank_tag(dims, sharded));

    auto model = make_model(c.dtype, c.tied);
    const auto units = resolve_units(*model, options(c));
    int64_t trainable_fsdp = 0;
    for (const auto& u : units)
      if (u.trainable() && (u.sharding == Sharding::kFullShard || u.sharding == Sharding::kShardGradOp))
        ++trainable_fsdp;
    ASSERT_GT(trainable_fsdp, 0);
    EXPECT_EQ(got.step1[OpKind::kReduceScatter].calls, trainable_fsdp) << tag;
    EXPECT_EQ(base.step1[OpKind::kReduceScatter].calls, trainable_fsdp * c.accum) << tag;
    if (n > 1)
      EXPECT_NEAR(got.step1[OpKind::kReduceScatter].logical_bytes * c.accum,
                  base.step1[OpKind::kReduceScatter].logical_bytes, 1e-6)
          << tag;

    // The traffic plan (traffic_plan.h) against step 1's bytes on the data plane, both modes
    // (the main lane carries the test's two scalar all-reduces, not planned).
    std::vector<std::pair<std::string, std::string>> call_order;
    for (const auto& u : model->units())
      call_order.emplace_back(u.path, u.shares_params_with.empty() ? u.path : u.shares_params_with);
    for (const RunResult* r : {&got, &base}) {
      const bool unsharded = r == &got;
      const TrafficPlan tp = plan_traffic(units, call_order, MeshShape{n, 0, n}, c.dtype, c.reduce, unsharded,
                                          calls_without_backward_gather(*model, units));
      double measured = 0;
      for (const auto& [plane, st] : r->step1_comms)
        if (plane != "data") measured += st.logical_bytes();
      EXPECT_NEAR(measured, tp.group_bytes(CommGroup::kWorld, c.accum), 1e-6) << tag << (unsharded ? " unsharded" : " sharded");
      EXPECT_DOUBLE_EQ(tp.inter_node_bytes(c.accum), 0.0);  // one node
      if (n > 1) EXPECT_GT(measured, 0.0);
    }
    const MemoryPlan plan = plan_memory(units, n, c.dtype, c.reduce, /*accumulate_unsharded=*/true);
    const MemoryPlan plan_off = plan_memory(units, n, c.dtype, c.reduce);
    EXPECT_GT(plan.unsharded_accum_bytes, 0.0);
    EXPECT_DOUBLE_EQ(plan_off.unsharded_accum_bytes, 0.0);
    EXPECT_DOUBLE_EQ(got.memory.unsharded_accum_peak_bytes, plan.unsharded_accum_bytes) << tag;
    EXPECT_DOUBLE_EQ(base.memory.unsharded_accum_peak_bytes, 0.0) << tag;
    EXPECT_DOUBLE_EQ(got.memory.grad_bytes, base.memory.grad_bytes) << tag;  // persistent: unchanged
    std::printf("%s: reduce-scatters in step 1: %lld (sharded mode %lld), %.0f B (%.0f B); unsharded "
                "accumulators peak %.0f B (plan %.0f B)\n",
                tag.c_str(), static_cast<long long>(got.step1[OpKind::kReduceScatter].calls),
                static_cast<long long>(base.step1[OpKind::kReduceScatter].calls),
                got.step1[OpKind::kReduceScatter].logical_bytes, base.step1[OpKind::kReduceScatter].logical_bytes,
                got.memory.unsharded_accum_peak_bytes, plan.unsharded_accum_bytes);
  }
}

TEST(FsdpAccumDist, UnshardedAccumulationEqualsOneProcessWorld1) {
  ParallelOptions o;
  o.device = "cpu";
  auto dims = ParallelDims::init(DistEnv{}, o);
  check_unsharded_accumulation(dims);
}

TEST(FsdpAccumDist, DISABLED_Worker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  check_unsharded_accumulation(dims);
  dims.comm().barrier("end");
}

TEST(FsdpAccumDist, UnshardedAccumulationEqualsOneProcessWorld2) {
  launch(2, "FsdpAccumDist.DISABLED_Worker", 240);
}

}  // namespace
