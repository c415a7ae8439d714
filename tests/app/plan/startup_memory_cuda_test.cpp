// Sharded loading on a GPU (sharding/parallel/sharded_load.h): the caching allocator's bytes
// after materialising Qwen2-VL-2B's geometry in bf16 as rank 3 of 8 equal the memory plan's
// persistent parameter bytes (app/plan/memory_plan.h; up to the allocator's 512-byte
// rounding per tensor), and its peak stays there: FSDP's [N*S] gather buffers get no device
// memory, and the random init computes on the host. The CPU twin is startup_memory_test.cpp.
// Label cuda: skipped where no GPU is visible; the GPU run runs it.
#include <gtest/gtest.h>

#include <c10/cuda/CUDACachingAllocator.h>

#include "app/plan/memory_plan.h"
#include "sharding/parallel/sharded_load.h"
#include "vlm/io/param_source.h"
#include "vlm/model/config.h"
#include "vlm/model/vision_language_model.h"

namespace {

namespace sh = vlm::sharding;

c10::CachingAllocator::Stat allocated_stat() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
}

TEST(StartupMemoryCuda, ShardedLoadAllocatesOnlyWhatTheRankKeeps) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device visible to LibTorch (torch::cuda::is_available() is false); "
                    "the GPU run (scripts/gpu/device_run.sh) runs the cuda label on a lent GPU";
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
  size_t tensors = 0;
  for (const auto& u : units) tensors += sh::shards_params(u.sharding) ? 1 : u.params.size();
  auto source = vlm::init_param_source(*model, {torch::kCPU, torch::kBFloat16, 7});
  torch::cuda::synchronize();
  const int64_t before = allocated_stat().current;
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  sh::ShardedLoad loaded =
      sh::materialize_units(*model, units, kRank, kWorld, torch::Device(torch::kCUDA, 0), torch::kBFloat16, *source);
  torch::cuda::synchronize();
  const double kept = static_cast<double>(allocated_stat().current - before);
  const double peak = static_cast<double>(allocated_stat().peak - before);
  std::printf("start-up on CUDA, rank %d of %d: kept %.0f B, peak %.0f B, plan %.0f B, whole model %.0f B\n", kRank,
              kWorld, kept, peak, plan.total.param_bytes, plan.whole_params_bytes);
  EXPECT_GE(kept, plan.total.param_bytes);
  EXPECT_LE(kept, plan.total.param_bytes + 512.0 * static_cast<double>(tensors));
  EXPECT_LE(peak, kept + 512.0 * static_cast<double>(tensors));
  EXPECT_EQ(loaded.shards.size(), units.size() - 1);
}

}  // namespace
