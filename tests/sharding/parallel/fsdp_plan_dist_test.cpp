// The memory plan against the FSDP engine's own accounting (split from fsdp_dist_test.cpp;
// helpers in fsdp_testing.h).
#include <gtest/gtest.h>

#include <algorithm>

#include "app/plan/memory_plan.h"
#include "tests/sharding/parallel/fsdp_testing.h"

using namespace vlm::sharding;
using namespace vlm::app;  // the cost models (app/plan/)
using namespace fsdp_testing;

// ---------------------------------------------------------------- memory plan vs engine

// The memory plan (memory_plan.h, what `vlmtrain plan` prints) against the engine's own
// accounting (ShardedModel::memory(): the tensors it holds, the flat buffers it gathered,
// the reduce-scatter buffers it had in flight) after two steps, bf16 params and fp32 reduce
// (gradients fp32, unlike the params), for frozen-vision full_shard (frozen sharded vision,
// ddp merger, full_shard LLM, 2 micro-batches) and all-fsdp shard_grad_op. Params and grads:
// equal. Optimizer state: the plan counts padded shards S, the engine [hi - lo] (equal on
// rank 0; the last rank holds less, by at most 12 B x the padding). Transient: measured <=
// planned, and the reduce-scatter peak is at least the largest unit's buffers.
static void check_plan_vs_engine(ParallelDims& dims) {
  const int n = dims.world_size();
  for (const char* strategy : {"full_shard", "shard_grad_op"}) {
    Config c;
    c.strategy = strategy;
    c.frozen_vision = c.strategy == "full_shard";
    c.accum = c.frozen_vision ? 2 : 1;
    c.dtype = torch::kBFloat16;
    c.end = 2;
    const RunResult r = sharded_run(dims, c);
    auto model = make_model(c.dtype, c.tied);
    const auto units = resolve_units(*model, options(c));
    const MemoryPlan plan = plan_memory(units, n, c.dtype, c.reduce);
    const std::string tag = rank_tag(dims, c);
    EXPECT_DOUBLE_EQ(r.memory.param_bytes, plan.total.param_bytes) << tag;
    EXPECT_DOUBLE_EQ(r.memory.grad_bytes, plan.total.grad_bytes) << tag;
    double pad = 0, largest_rs = 0;
    for (const auto& u : units) {
      const double shard = static_cast<double>((u.numel + n - 1) / n);
      if (u.sharding != Sharding::kReplicated && u.sharding != Sharding::kFrozen) pad += shard * n - u.numel;
      if (u.trainable() && (u.sharding == Sharding::kFullShard || u.sharding == Sharding::kShardGradOp))
        largest_rs = std::max(largest_rs, 4.0 * (shard * n + shard));
    }
    EXPECT_LE(r.memory.optim_bytes, plan.total.optim_bytes) << tag;
    EXPECT_GE(r.memory.optim_bytes, plan.total.optim_bytes - 12.0 * pad) << tag;
    if (dims.rank() == 0) EXPECT_DOUBLE_EQ(r.memory.optim_bytes, plan.total.optim_bytes) << tag;
    EXPECT_LE(r.memory.gathered_peak_bytes, plan.gathered_peak_bytes) << tag;
    EXPECT_GT(r.memory.gathered_peak_bytes, 0.0) << tag;
    EXPECT_LE(r.memory.reduce_scatter_peak_bytes, plan.reduce_scatter_peak_bytes) << tag;
    EXPECT_GE(r.memory.reduce_scatter_peak_bytes, largest_rs) << tag;
    std::printf("plan vs engine, %s: params %.0f / %.0f B, grads %.0f / %.0f B, optimizer %.0f / %.0f B, "
                "gathered peak %.0f / %.0f B, reduce-scatter peak %.0f / %.0f B (measured / planned)\n",
                tag.c_str(), r.memory.param_bytes, plan.total.param_bytes, r.memory.grad_bytes, plan.total.grad_bytes,
                r.memory.optim_bytes, plan.total.optim_bytes, r.memory.gathered_peak_bytes, plan.gathered_peak_bytes,
                r.memory.reduce_scatter_peak_bytes, plan.reduce_scatter_peak_bytes);
  }
}

TEST(FsdpPlanDist, MemoryPlanMatchesEngineWorld1) {
  auto dims = ParallelDims::init(DistEnv{}, ParallelOptions{});
  check_plan_vs_engine(dims);
}

TEST(FsdpPlanDist, DISABLED_MemoryPlanWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  check_plan_vs_engine(dims);
  dims.comm().barrier("end");
}

TEST(FsdpPlanDist, MemoryPlanMatchesEngineWorld2) { launch(2, "FsdpPlanDist.DISABLED_MemoryPlanWorker", 120); }
