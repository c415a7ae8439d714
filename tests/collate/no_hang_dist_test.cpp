// The collate cannot hang a job (issue #6): 2 and 4 Gloo ranks train the tiny model (and 2
// ranks the tiny Qwen3-VL model, with its 32-px resize factor and DeepStack mergers) with a
// gradient all-reduce per micro-batch on adversarial steps (one rank gets only text-only
// samples, another only multi-image samples, one far fewer tokens, a dataset size not
// divisible by the world size). Every rank must finish every step, end with identical
// parameters, and the step loss must equal one process on the whole global batch. With
// padding-free packing (issue #27) the same matrix runs on packed rows, and its reference is
// still the padded one-process batch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "collate/micro_batch.h"
#include "collate/step_plan.h"
#include "sharding/dist/comm.h"
#include "sharding/dist/parallel_dims.h"
#include "tests/collate/synthetic.h"
#include "tests/dist_testing.h"
#include "vlm/model/meta_init.h"

using namespace vlm::collate;

namespace {

constexpr int64_t kPadId = 0;
constexpr int kHangSteps = 3;

// The global samples of step `step`. One (world 2, 3) or two (world 4) multi-image samples
// whose cost exceeds what longest-processing-time-first gives the other ranks, so those
// ranks get only text; many short text-only samples (more than one micro-batch's worth on
// a text rank, so the image ranks get fillers); one tiny sample. 27, 40 or 43 samples: not
// divisible by the world size.
std::vector<vlm::TokenizedSample> step_samples(const vlm::VlmConfig& cfg, int step, int world) {
  std::mt19937_64 rng(100 + step);
  std::vector<vlm::TokenizedSample> out;
  int64_t idx = step * 1000;
  out.push_back(vlm::test::synthetic_sample(cfg, rng, idx++, 20, {{1, 8, 8}, {1, 8, 8}, {1, 8, 8}}, 6));
  if (world == 4) out.push_back(vlm::test::synthetic_sample(cfg, rng, idx++, 18, {{1, 8, 8}, {1, 8, 4}}, 5));
  for (int i = 0; i < (world == 2 ? 25 : world == 3 ? 38 : 40); ++i)
    out.push_back(vlm::test::synthetic_sample(cfg, rng, idx++, 4 + i % 2, {}, 1));
  out.push_back(vlm::test::synthetic_sample(cfg, rng, idx++, 2, {}, 1));
  return out;
}

TEST(NoHangDist, DISABLED_Worker) {
  VLM_DIST_WORKER_ONLY();
  using namespace vlm::sharding;
  ParallelOptions popts;
  popts.timeout = std::chrono::seconds(60);
  ParallelDims dims = ParallelDims::from_environment(popts);
  Comm& comm = dims.comm();
  const int rank = dims.rank(), world = dims.world_size();

  const char* preset = std::getenv("VLMTRAIN_TEST_NO_HANG_PRESET");  // set by run_world
  const char* packing_env = std::getenv("VLMTRAIN_TEST_NO_HANG_PACKING");
  const bool packing = packing_env != nullptr && std::string(packing_env) == "1";
  auto cfg = vlm::preset(preset != nullptr && *preset != '\0' ? preset : "tiny");
  vlm::VisionLanguageModel model(cfg);
  vlm::MaterializeOptions mopts;
  mopts.seed = 11;
  vlm::materialize(*model, mopts);  // same seed everywhere: identical start
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));

  const int64_t patch = cfg.vision.patch_size, merge = cfg.vision.spatial_merge_size;
  Budgets b = vlm::test::synthetic_budgets(patch * merge);
  b.max_tokens = 80;  // the 74-token multi-image sample fills a micro-batch alone
  b.packing = packing;
  for (int step = 0; step < kHangSteps; ++step) {
    auto samples = step_samples(cfg, step, world);
    std::map<int64_t, const vlm::TokenizedSample*> by_index;
    std::vector<SampleCost> costs;
    for (const auto& s : samples) {
      by_index[s.index] = &s;
      costs.push_back(vlm::test::synthetic_cost(s, patch, merge));
    }
    StepPlan plan = plan_step(costs, world, b);  // global facts only: same on every rank

    // Premise of the test: the plan really is adversarial.
    auto images_on = [&](int r) {
      int64_t n = 0;
      for (const auto& mb : plan.ranks[r].micro_batches)
        for (const auto& ps : mb.samples) n += ps.images.size();
      return n;
    };
    int fillers = 0;
    for (const auto& rp : plan.ranks)
      for (const auto& mb : rp.micro_batches) fillers += mb.filler();
    ASSERT_GT(images_on(0), 0);
    ASSERT_EQ(plan.ranks[0].micro_batches.at(0).samples.size(), 1u) << "rank 0: the multi-image sample alone";
    ASSERT_EQ(images_on(world - 1), 0) << "last rank: text only";
    ASSERT_GT(fillers, 0) << "some rank must run filler micro-batches";
    ASSERT_GT(plan.micro_batches, 1);
    const RankPlan& mine = plan.ranks[rank];

    // Token normalisation: supervised tokens of the whole step, all ranks (one all-reduce).
    std::vector<MicroBatch> mbs;
    for (const auto& mbp : mine.micro_batches) {
      if (mbp.filler()) {
        mbs.push_back(filler_micro_batch(kPadId));
        continue;
      }
      std::vector<vlm::TokenizedSample> rows_of;
      for (const auto& ps : mbp.samples) rows_of.push_back(*by_index.at(ps.index));
      mbs.push_back(packing ? build_packed_micro_batch(rows_of, cfg) : build_micro_batch(rows_of, cfg, kPadId));
    }
    auto tokens = torch::zeros({1}, torch::kDouble);
    for (const auto& mb : mbs) tokens[0] += static_cast<double>(mb.supervised_tokens);
    comm.all_reduce(tokens, ReduceOp::kSum, "step " + std::to_string(step) + " token count");
    const double global_tokens = tokens.item<double>();

    // Reference: this rank alone runs the whole global batch as one micro-batch.
    double ref_loss;
    {
      torch::NoGradGuard no_grad;
      auto ref = model->forward(build_micro_batch(samples, cfg, kPadId).batch);
      ASSERT_EQ(static_cast<double>(ref.n_tokens), global_tokens);
      ref_loss = ref.loss_sum.item<double>() / ref.n_tokens;
    }

    // Micro-batches: each one's gradient is all-reduced right after its backward, so every
    // rank issues exactly the same collectives in the same order (or this hangs and the
    // harness kills it), then accumulated.
    auto params = model->named_parameters();
    std::vector<torch::Tensor> acc;
    for (auto& p : params) acc.push_back(torch::zeros_like(p.value()));
    double local_loss = 0;
    int micro = 0;
    for (const auto& mb : mbs) {
      opt.zero_grad();
      auto out = model->forward(mb.batch);
      (out.loss_sum / global_tokens).backward();
      local_loss += out.loss_sum.item<double>();
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& g = params[i].value().grad();
        ASSERT_TRUE(g.defined()) << "rank " << rank << " step " << step << ": no grad for " << params[i].key();
        comm.all_reduce(g, ReduceOp::kSum,
                        "step " + std::to_string(step) + " micro " + std::to_string(micro) + " " + params[i].key());
        acc[i] += g;
      }
      ++micro;
    }
    EXPECT_EQ(micro, plan.micro_batches);
    for (size_t i = 0; i < params.size(); ++i) params[i].value().mutable_grad() = acc[i];
    opt.step();

    // The step's token-weighted loss over all ranks equals the one-process loss.
    auto loss = torch::tensor({local_loss}, torch::kDouble);
    comm.all_reduce(loss, ReduceOp::kSum, "step " + std::to_string(step) + " loss");
    double step_loss = loss.item<double>() / global_tokens;
    EXPECT_NEAR(step_loss, ref_loss, 1e-6 * std::abs(ref_loss)) << "rank " << rank << " step " << step;
  }

  // Every rank ends with bit-identical parameters.
  for (auto& p : model->named_parameters()) {
    auto hi = p.value().detach().clone(), lo = p.value().detach().clone();
    comm.all_reduce(hi, ReduceOp::kMax, "final max " + p.key());
    comm.all_reduce(lo, ReduceOp::kMin, "final min " + p.key());
    EXPECT_TRUE(torch::equal(hi, lo)) << p.key() << " differs across ranks";
  }
  comm.barrier("end");
}

}  // namespace

namespace {

void run_world(int world, const std::string& preset = "tiny", bool packing = false) {
  vlm::test::DistRun run;
  run.world_size = world;
  run.worker_test = "NoHangDist.DISABLED_Worker";
  run.timeout = std::chrono::seconds(120);
  run.extra_env = [preset, packing](int) {
    return std::vector<std::string>{"VLMTRAIN_TEST_NO_HANG_PRESET=" + preset,
                                    std::string("VLMTRAIN_TEST_NO_HANG_PACKING=") + (packing ? "1" : "0")};
  };
  EXPECT_TRUE(vlm::test::all_ok(vlm::test::run_workers(run)));
}

TEST(NoHangDist, TwoRanks) { run_world(2); }
TEST(NoHangDist, FourRanks) { run_world(4); }
TEST(NoHangDist, TwoRanksQwen3) { run_world(2, "tiny-qwen3"); }
TEST(NoHangDist, TwoRanksPacked) { run_world(2, "tiny", true); }
TEST(NoHangDist, ThreeRanksPacked) { run_world(3, "tiny", true); }
TEST(NoHangDist, FourRanksPacked) { run_world(4, "tiny", true); }
TEST(NoHangDist, TwoRanksQwen3Packed) { run_world(2, "tiny-qwen3", true); }
TEST(NoHangDist, TwoRanksQwen35) { run_world(2, "tiny-qwen3.5"); }
TEST(NoHangDist, TwoRanksQwen35Packed) { run_world(2, "tiny-qwen3.5", true); }

}  // namespace
