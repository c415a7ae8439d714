// Start-up memory: sharded loading (sharding/parallel/sharded_load.h) allocates on the device
// only what the rank keeps. The allocator's own count (vlm/runtime/tensor_memory.h: every
// storage the CPU allocator hands out, touched or not, as the CUDA caching allocator counts
// its allocations) is held to the memory plan's start-up figure (app/plan/memory_plan.h), for
// Qwen2-VL-2B's geometry in bf16 at world 8: rank 3 of 8 keeps 1/8 of every FSDP unit and the
// whole DDP merger. The plan's arithmetic and the allocator's count are independent.
#include <gtest/gtest.h>

#include "app/plan/memory_plan.h"
#include "sharding/parallel/flat_buffer.h"
#include "sharding/parallel/sharded_model.h"
#include "sharding/parallel/sharded_load.h"
#include "vlm/io/param_source.h"
#include "vlm/model/config.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/runtime/tensor_memory.h"

namespace {

using vlm::TensorMemoryMeter;
namespace sh = vlm::sharding;

TEST(StartupMemory, ShardedLoadAllocatesOnlyWhatTheRankKeeps) {
  TensorMemoryMeter::install();
  constexpr int kWorld = 8, kRank = 3;
  sh::ShardingOptions o;
  o.default_policy = "fsdp";
  o.default_strategy = "full_shard";
  o.rules = {{"visual.merger", "ddp", ""}};
  o.param_dtype = torch::kBFloat16;
  vlm::VisionLanguageModel model(vlm::preset("qwen2-vl-2b"),
                                 torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16));
  const auto units = sh::resolve_units(*model, o);
  const vlm::app::MemoryPlan plan = vlm::app::plan_memory(units, kWorld, torch::kBFloat16);
  // The whole model would not fit a budget of twice the plan's start-up peak.
  ASSERT_GT(plan.whole_params_bytes, 4 * plan.total.param_bytes);

  auto source = vlm::init_param_source(*model, {torch::kCPU, torch::kBFloat16, 7});
  const int64_t before = TensorMemoryMeter::live_bytes();
  TensorMemoryMeter::reset_peak();
  sh::ShardedLoad loaded = sh::materialize_units(*model, units, kRank, kWorld, torch::kCPU, torch::kBFloat16, *source);
  source.reset();
  const double kept = static_cast<double>(TensorMemoryMeter::live_bytes() - before);
  const double peak = static_cast<double>(TensorMemoryMeter::peak_bytes() - before);
  // What the rank keeps: exactly the plan's persistent parameter bytes (shards + whole units).
  EXPECT_EQ(kept, plan.total.param_bytes);
  // The peak: that plus the random-init source's temporaries, one parameter at a time computed
  // whole in fp32 and cast to bf16 (host memory on CUDA; here host and device share the CPU
  // allocator, so the meter sees them), far below the whole model.
  double largest_param = 0;
  for (const auto& u : units)
    for (const auto& p : u.params) largest_param = std::max(largest_param, static_cast<double>(p.param.numel()));
  EXPECT_LE(peak, plan.total.param_bytes + (4 + 2) * largest_param)
      << "planned " << plan.total.param_bytes << ", whole model " << plan.whole_params_bytes;
  EXPECT_LT(peak, plan.whole_params_bytes / 2);
  EXPECT_EQ(loaded.shards.size(), units.size() - 1);  // every unit but the merger

  // The gather buffers hold no memory until the engine gathers them; reading one throws.
  const auto real = sh::resolve_units(*model, o);
  for (const auto& u : real) {
    const torch::Tensor& p0 = u.params.front().param;
    if (u.path == "visual.merger") {
      EXPECT_FALSE(sh::is_released(p0.storage().unsafeGetStorageImpl()));
      continue;
    }
    EXPECT_TRUE(sh::is_released(p0.storage().unsafeGetStorageImpl())) << u.path;
    EXPECT_TRUE(sh::params_are_flat_slices(u.params, kWorld * ((u.numel + kWorld - 1) / kWorld))) << u.path;
  }
  EXPECT_THROW(real.back().params.front().param.sum().item<float>(), c10::Error);
}

// The start-up plan's formulas on a layout with every kind of unit.
TEST(StartupMemory, PlanFormulas) {
  sh::ShardingOptions o;
  o.default_policy = "fsdp";
  o.default_strategy = "full_shard";
  o.rules = {{"visual.merger", "ddp", ""}, {"visual.blocks.*", "freeze", ""}};
  vlm::VisionLanguageModel model(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
  auto units = sh::resolve_units(*model, o);
  sh::apply_freeze(units);
  const vlm::app::MemoryPlan plan = vlm::app::plan_memory(units, 4, torch::kFloat32);
  double whole = 0, largest_flat = 0;
  for (const auto& u : units) {
    whole += 4.0 * u.numel;
    if (sh::shards_params(u.sharding)) largest_flat = std::max(largest_flat, 4.0 * 4 * ((u.numel + 3) / 4));
  }
  EXPECT_EQ(plan.whole_params_bytes, whole);
  EXPECT_EQ(plan.largest_flat_bytes, largest_flat);
  EXPECT_EQ(plan.startup_peak_bytes(), plan.total.total());
  EXPECT_EQ(plan.whole_load_peak_bytes(), whole + largest_flat + plan.total.total());
}

}  // namespace
