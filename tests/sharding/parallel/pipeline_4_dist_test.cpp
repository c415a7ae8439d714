// Pipeline parallelism at world 4, its own ctest entry so that each entry stays well inside
// the dist timeout: dp 2 x pp 2, pp 4 (one layer per stage, m = 4 and m = 2 < pp) and
// pp 2 x tp 2. The worker, PipelineParallelDist's DISABLED_EqualsOneProcessWorker, and its
// harness (fp64 one-process reference, 10 AdamW steps, gradients, parameters, the links'
// bytes) are in pipeline_dist_test.cpp, in the same test executable; here are the launches
// (real processes on Gloo over loopback, a hard timeout).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/sharding/parallel/fsdp_testing.h"

namespace {

std::vector<std::string> pp4_env(int pp, int tp) {
  return {"VLMTRAIN_TEST_PP=" + std::to_string(pp), "VLMTRAIN_TEST_TP=" + std::to_string(tp)};
}

TEST(PipelineParallel4Dist, EqualsOneProcessDp2Pp2World4) {
  fsdp_testing::launch(4, "PipelineParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return pp4_env(2, 1); });
}

TEST(PipelineParallel4Dist, EqualsOneProcessPp4World4) {
  fsdp_testing::launch(4, "PipelineParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return pp4_env(4, 1); });
}

TEST(PipelineParallel4Dist, EqualsOneProcessPp2Tp2World4) {
  fsdp_testing::launch(4, "PipelineParallelDist.DISABLED_EqualsOneProcessWorker", 540, [](int) { return pp4_env(2, 2); });
}

}  // namespace
