// Lanes of the data plane (parallel_dims.h): FSDP all-gathers, FSDP reduce-scatters and DDP
// bucket all-reduces each go over their own process group, so ranks whose autograd runs in
// a different order (different graphs, late hooks) cannot mismatch collectives.
//
// The divergent run, world 2, on the tiny model: the vision blocks and the LLM FSDP
// full_shard (tied head), visual.merger DDP between them, two micro-batches per step. Rank 1's samples have no
// image (its vision tower runs the dummy image, so its graph differs from rank 0's), and
// rank 0 launches its DDP buckets only at the end of backward while rank 1 launches them
// during backward, before the vision blocks' reduce-scatters: the two ranks issue the same
// ops per lane but interleave the lanes differently. On one group (VLMTRAIN_TEST_ONE_GROUP=1, the
// negative control below) rank 1's DDP all-reduce meets rank 0's first vision reduce-scatter. Losses and final parameters must equal one process over the same samples
// (reference_run splits rank 1's text-only samples into a second forward; the loss is
// summed over supervised tokens either way), within 1e-5 relative loss / 1e-5 absolute
// parameters (fp32; the reduction order is all that differs). Hard timeout: a mismatch that
// hangs fails the test instead of stalling.
#include "tests/sharding/parallel/fsdp_testing.h"

namespace {

using namespace fsdp_testing;

Config divergent_config() {
  Config c;
  c.frozen_vision = false;  // vision blocks and LLM FSDP full_shard, visual.merger DDP
  c.merger_ddp = true;
  c.text_only_rank1 = true;
  c.ddp_late_rank0 = true;
  c.accum = 2;
  c.end = 3;
  return c;
}

TEST(LanesDist, DISABLED_DivergentWorker) {
  VLM_DIST_WORKER_ONLY();
  torch::set_num_threads(1);
  auto dims = init_fsdp_worker();
  const Config c = divergent_config();
  const RunResult want = reference_run(c, dims.world_size());
  const RunResult got = sharded_run(dims, c);
  compare(got, want, rank_tag(dims, c) + " divergent (text-only rank 1, late DDP on rank 0)");
  // Each lane carried its own kind of op.
  EXPECT_GT(dims.comm(Lane::kGather).stats()[OpKind::kAllGather].calls, 0);
  EXPECT_EQ(dims.comm(Lane::kGather).stats()[OpKind::kReduceScatter].calls, 0);
  EXPECT_GT(dims.comm(Lane::kReduce).stats()[OpKind::kReduceScatter].calls, 0);
  EXPECT_EQ(dims.comm(Lane::kReduce).stats()[OpKind::kAllGather].calls, 0);
  EXPECT_GT(dims.comm(Lane::kDdp).stats()[OpKind::kAllReduce].calls, 0);
  EXPECT_EQ(dims.comm(Lane::kDdp).stats()[OpKind::kReduceScatter].calls, 0);
  dims.comm().barrier("end");
}

TEST(LanesDist, DivergentGraphsEqualOneProcessWorld2) { launch(2, "LanesDist.DISABLED_DivergentWorker", 180); }

// Negative control: the same run with every lane on one group fails, so the test above
// depends on the lanes. It opts into the shared-memory channel (VLMTRAIN_SHM_COMM=1), which
// compares the ranks' op descriptors and names the mismatched collective at once; on Gloo's
// TCP (the default) the same mismatch surfaces only as a timeout.
TEST(LanesDist, OneGroupMismatchesWorld2) {
  vlm::test::DistRun run;
  run.world_size = 2;
  run.timeout = std::chrono::seconds(120);
  run.worker_test = "LanesDist.DISABLED_DivergentWorker";
  run.extra_env = [](int) { return std::vector<std::string>{"VLMTRAIN_TEST_ONE_GROUP=1", "VLMTRAIN_TEST_TIMEOUT_S=15", "VLMTRAIN_SHM_COMM=1"}; };
  const auto results = vlm::test::run_workers(run);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_FALSE(vlm::test::all_ok(results)) << "one group: expected the divergent run to fail";
  bool mismatch = false;
  for (const auto& r : results) mismatch = mismatch || r.output.find("collective mismatch") != std::string::npos;
  EXPECT_TRUE(mismatch) << results[0].output;
}

// The groups themselves: four data-plane lanes, each its own group at world 2, distinct
// from the control plane's; at world 1 every lane is a local comm.
TEST(LanesDist, DISABLED_GroupsWorker) {
  VLM_DIST_WORKER_ONLY();
  auto dims = init_fsdp_worker();
  for (int l = 0; l < kNumLanes; ++l) {
    Comm& c = dims.comm(static_cast<Lane>(l));
    EXPECT_EQ(c.world_size(), 2);
    EXPECT_EQ(c.rank(), dims.rank());
    EXPECT_NE(&c, &dims.control());
    for (int k = 0; k < l; ++k) EXPECT_NE(&c, &dims.comm(static_cast<Lane>(k))) << "lanes " << k << ", " << l;
  }
  // One all-reduce per lane, in opposite lane orders on the two ranks: each pairs with its
  // own lane's op only when the lanes are separate groups (on one group, rank 0's first op
  // would meet rank 1's first, another lane's tensor).
  std::vector<torch::Tensor> t;
  std::vector<Work> works;
  for (int l = 0; l < kNumLanes; ++l) t.push_back(torch::full({1000}, static_cast<float>(l + dims.rank())));
  for (int i = 0; i < kNumLanes; ++i) {
    const int l = dims.rank() == 0 ? i : kNumLanes - 1 - i;
    works.push_back(dims.comm(static_cast<Lane>(l)).all_reduce_async(t[l], ReduceOp::kSum, "lane order"));
  }
  for (auto& w : works) w.wait();
  for (int l = 0; l < kNumLanes; ++l)
    EXPECT_TRUE(torch::equal(t[l], torch::full({1000}, static_cast<float>(2 * l + 1)))) << "lane " << l;
  const CommStats s = dims.data_stats();
  EXPECT_EQ(s[OpKind::kAllReduce].calls, kNumLanes);
  dims.reset_data_stats();
  EXPECT_EQ(dims.data_stats().calls(), 0);
  dims.comm().barrier("end");
}

TEST(LanesDist, OpsInOppositeLaneOrdersWorld2) { launch(2, "LanesDist.DISABLED_GroupsWorker", 90); }

TEST(LanesDist, WorldOneLanesAreLocal) {
  ParallelOptions o;
  o.device = "cpu";
  auto dims = ParallelDims::init(DistEnv{}, o);
  torch::Tensor t = torch::ones({3});
  for (int l = 0; l < kNumLanes; ++l) dims.comm(static_cast<Lane>(l)).all_reduce(t, ReduceOp::kSum, "w1");
  EXPECT_TRUE(torch::equal(t, torch::ones({3})));
  EXPECT_EQ(dims.data_stats().calls(), kNumLanes);
}

}  // namespace
