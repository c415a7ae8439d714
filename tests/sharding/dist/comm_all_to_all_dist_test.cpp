// Comm::all_to_all with variable splits (sharding/dist/comm.h), in real processes on Gloo
// over loopback at world 3: uneven splits and an empty rank, fp32 and bf16 (raw bytes), on
// the world comm and the EP comm; the same over VLMTRAIN_SHM_COMM=1 (the shared-memory
// channel hands all-to-alls to the comm's Gloo group); and a MoE model whose 8 experts do not
// split over dist.ep = 3 refused before any collective.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sharding/dist/comm.h"
#include "sharding/dist/dist_env.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/expert_parallel.h"
#include "tests/dist_testing.h"
#include "tests/sharding/dist/ep_worker.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/runtime/check.h"

using namespace vlm::sharding;

namespace {

void a2a_launch(std::vector<std::string> env) {
  vlm::test::DistRun run;
  run.world_size = 3;
  run.timeout = std::chrono::seconds(120);
  run.worker_test = "CommAllToAllDist.DISABLED_Worker";
  run.extra_env = [env](int) { return env; };
  const auto results = vlm::test::run_workers(run);
  EXPECT_TRUE(vlm::test::all_ok(results));
  if (!results.empty()) std::printf("%s", results[0].output.c_str());
}

// Comm::all_to_all alone: rank r sends (r + k) % 3 rows to rank k (rank 1 sends none to
// rank 2 and rank 2 none to itself...), rows [*, 3] with values naming (source, target,
// index); fp32 and bf16 (raw bytes); then one all-to-all where rank 0 has no rows at all.
void check_all_to_all(Comm& comm, torch::Dtype dtype) {
  const int n = comm.world_size(), r = comm.rank();
  auto rows_from_to = [](int src, int dst) { return static_cast<int64_t>((src + dst) % 3); };
  std::vector<int64_t> in_splits(n), out_splits(n);
  std::vector<float> in_vals;
  for (int k = 0; k < n; ++k) {
    in_splits[k] = rows_from_to(r, k);
    out_splits[k] = rows_from_to(k, r);
    for (int64_t i = 0; i < in_splits[k]; ++i)
      for (int c = 0; c < 3; ++c) in_vals.push_back(static_cast<float>(100 * r + 10 * k + i + (c == 2 ? 0.5 : 0)));
  }
  int64_t in_rows = 0, out_rows = 0, sent = 0;
  for (int k = 0; k < n; ++k) {
    in_rows += in_splits[k];
    out_rows += out_splits[k];
    if (k != r) sent += in_splits[k];
  }
  const torch::Tensor in = torch::tensor(in_vals).view({in_rows, 3}).to(dtype);
  torch::Tensor out = torch::full({out_rows, 3}, -1.0, torch::TensorOptions().dtype(dtype));
  comm.reset_stats();
  comm.all_to_all(out, in, out_splits, in_splits, "test: all_to_all");
  int64_t row = 0;
  for (int k = 0; k < n; ++k)
    for (int64_t i = 0; i < out_splits[k]; ++i, ++row) {
      EXPECT_EQ(out[row][0].item<float>(), static_cast<float>(100 * k + 10 * r + i)) << "row " << row;
      const float half = torch::tensor(100.0f * k + 10 * r + i + 0.5f).to(dtype).item<float>();  // as rounded
      EXPECT_EQ(out[row][2].item<float>(), half) << "row " << row;
    }
  const double bytes = static_cast<double>(sent) * 3 * c10::elementSize(dtype);
  EXPECT_DOUBLE_EQ(comm.stats()[OpKind::kAllToAll].logical_bytes, bytes);
  EXPECT_EQ(comm.stats()[OpKind::kAllToAll].calls, 1);
  // Rank 0 sends and receives nothing; the others exchange one row each among themselves.
  std::vector<int64_t> splits(n, r == 0 ? 0 : 1);
  splits[0] = 0;
  const int64_t rows = r == 0 ? 0 : n - 1;
  torch::Tensor a = torch::full({rows, 3}, static_cast<double>(r), torch::TensorOptions().dtype(dtype));
  torch::Tensor b = torch::empty({rows, 3}, a.options());
  comm.all_to_all(b, a, splits, splits, "test: all_to_all, rank 0 empty");
  for (int64_t i = 0; i < rows; ++i) EXPECT_EQ(b[i][0].item<float>(), static_cast<float>(i + 1));
}

TEST(CommAllToAllDist, DISABLED_Worker) {
  VLM_DIST_WORKER_ONLY();
  auto dims = vlm::test::ep_worker_dims();
  for (Comm* c : {&dims.comm(), &dims.ep_comm()}) {
    check_all_to_all(*c, torch::kFloat32);
    check_all_to_all(*c, torch::kBFloat16);
  }
  EXPECT_EQ(dims.ep_comm().world_size(), dims.world_size());
  EXPECT_EQ(dims.expert_replicate_comm().world_size(), 1);
  // 8 experts over ep = 3: refused with a clear error, before any collective.
  vlm::VisionLanguageModel model(vlm::preset("tiny-qwen3-moe"), torch::TensorOptions().device(torch::kMeta));
  try {
    apply_expert_parallel(*model, dims);
    ADD_FAILURE() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("8 experts per layer do not split over dist.ep = 3"), std::string::npos)
        << e.what();
  }
  dims.comm().barrier("end");
}

TEST(CommAllToAllDist, UnevenSplitsWorld3) { a2a_launch({"VLMTRAIN_TEST_EP=3"}); }

TEST(CommAllToAllDist, SharedMemoryHandsAllToAllToGlooWorld3) {
  a2a_launch({"VLMTRAIN_TEST_EP=3", "VLMTRAIN_SHM_COMM=1"});
}

}  // namespace
