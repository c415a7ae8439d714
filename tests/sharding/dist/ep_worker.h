// Worker side of the expert-parallel multi-process tests: the mesh a worker builds (CPU,
// Gloo, dist.ep from VLMTRAIN_TEST_EP) and the environment a launcher gives it.
#pragma once
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "sharding/dist/dist_env.h"
#include "sharding/dist/parallel_dims.h"
#include "vlm/runtime/check.h"

namespace vlm::test {

inline vlm::sharding::ParallelDims ep_worker_dims() {
  vlm::sharding::ParallelOptions o;
  o.timeout = std::chrono::seconds(60);
  o.device = "cpu";
  const char* ep = std::getenv("VLMTRAIN_TEST_EP");
  o.ep = ep != nullptr ? std::atoi(ep) : 1;
  return vlm::sharding::ParallelDims::init(vlm::sharding::detect_dist_env(vlm::sharding::process_env()), o);
}

inline std::vector<std::string> ep_worker_env(int ep) { return {vlm::str("VLMTRAIN_TEST_EP=", ep)}; }

}  // namespace vlm::test
