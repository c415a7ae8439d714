// Tensor parallelism with fewer key/value heads than tp ranks, its own ctest entry so that
// each entry stays well inside the dist timeout: tp 4 at world 4 on the attention-only tiny
// families (2 key/value heads: each on two ranks). The worker, TensorParallelDist's
// DISABLED_EqualsOneProcessWorker, and its harness (fp64 one-process reference, 10 AdamW
// steps, gradients, parameters, the bytes' formula) are in tensor_parallel_dist_test.cpp, in
// the same test executable; here is the launch (real processes on Gloo over loopback, a hard
// timeout).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/sharding/parallel/fsdp_testing.h"

namespace {

TEST(TensorParallelKvDist, EqualsOneProcessTp4World4) {
  fsdp_testing::launch(4, "TensorParallelDist.DISABLED_EqualsOneProcessWorker", 540,
                       [](int) { return std::vector<std::string>{"VLMTRAIN_TEST_TP=4"}; });
}

}  // namespace
