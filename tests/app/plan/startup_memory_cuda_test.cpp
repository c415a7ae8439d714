// Sharded loading on a GPU (sharding/parallel/sharded_load.h): the caching allocator's bytes
// after materialising Qwen2-VL-2B's geometry in bf16 as rank 3 of 8 equal the memory plan's
// persistent parameter bytes (app/plan/memory_plan.h) up to the allocator's rounding per
// tensor, and its peak stays there: FSDP's [N*S] gather buffers get no device memory, and the
// random init computes on the host. The CPU twin is startup_memory_test.cpp.
// The caching allocator's rounding (allocated_bytes counts whole blocks): a tensor of at most
// 1 MiB takes a multiple of 512 B; a larger one can also take the rest of its segment when
// that rest would be 1 MiB or less (blocks are split only above that), so up to 1 MiB more.
// Measured on an H200 (2026-11-28): 25.0 MiB over the plan in all for this rank's tensors.
// Label cuda: skipped where no GPU is visible; the GPU run runs it.
#include <gtest/gtest.h>

#include <ATen/Context.h>
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
  // The allocator's slack over the rank's tensors: a shard [ceil(numel / N)] per sharded unit,
  // the parameters of the others.
  const double elem = 2.0, mib = 1024.0 * 1024.0;
  auto slack_of = [&](double bytes) { return bytes > mib ? mib : 512.0; };
  double slack = 0;
  for (const auto& u : units) {
    if (sh::shards_params(u.sharding)) {
      slack += slack_of(elem * static_cast<double>((u.numel + kWorld - 1) / kWorld));
    } else {
      for (const auto& p : u.params) slack += slack_of(elem * static_cast<double>(p.param.numel()));
    }
  }
  auto source = vlm::init_param_source(*model, {torch::kCPU, torch::kBFloat16, 7});
  // The caching allocator sizes its per-device table at CUDA's lazy init, which nothing has
  // run yet in this process: its stats of device 0 throw "Invalid device argument" until then.
  at::globalContext().lazyInitDevice(at::kCUDA);
  torch::cuda::synchronize();
  const int64_t before = allocated_stat().current;
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  sh::ShardedLoad loaded =
      sh::materialize_units(*model, units, kRank, kWorld, torch::Device(torch::kCUDA, 0), torch::kBFloat16, *source);
  torch::cuda::synchronize();
  const double kept = static_cast<double>(allocated_stat().current - before);
  const double peak = static_cast<double>(allocated_stat().peak - before);
  std::printf("start-up on CUDA, rank %d of %d: kept %.0f B, peak %.0f B, plan %.0f B (+ allocator slack up to %.0f B), "
              "whole model %.0f B\n", kRank, kWorld, kept, peak, plan.total.param_bytes, slack, plan.whole_params_bytes);
  EXPECT_GE(kept, plan.total.param_bytes);
  EXPECT_LE(kept, plan.total.param_bytes + slack);
  EXPECT_LE(peak, kept + slack);
  EXPECT_EQ(loaded.shards.size(), units.size() - 1);
}

}  // namespace
