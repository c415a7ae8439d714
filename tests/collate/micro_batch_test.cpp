// Micro-batch tensors (issue #6): padding, labels, masks, M-RoPE positions per row,
// packed pixels; fillers run every unit; and the token-weighted loss of a step split
// across simulated ranks equals one process running the whole global batch.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "collate/micro_batch.h"
#include "collate/step_plan.h"
#include "vlm/runtime/check.h"
#include "vlm/model/meta_init.h"
#include "tests/collate/synthetic.h"
#include "vlm/model/rope_index.h"

using namespace vlm::collate;

namespace {

constexpr int64_t kPad = 0;

vlm::TokenizedSample make_sample(const vlm::VlmConfig& cfg, std::mt19937_64& rng, int64_t index,
                                 int64_t text, const std::vector<std::array<int64_t, 3>>& grids,
                                 int64_t answer) {
  return vlm::test::synthetic_sample(cfg, rng, index, text, grids, answer);
}

vlm::VisionLanguageModel tiny_model() {
  torch::manual_seed(0);
  vlm::VisionLanguageModel model(vlm::preset("tiny"));
  vlm::MaterializeOptions opts;
  opts.seed = 3;
  vlm::materialize(*model, opts);
  return model;
}

TEST(MicroBatch, PadsLabelsMasksAndPositionsPerRow) {
  auto cfg = vlm::preset("tiny");
  std::mt19937_64 rng(1);
  std::vector<vlm::TokenizedSample> samples = {
      make_sample(cfg, rng, 7, 12, {{1, 4, 6}}, 5),
      make_sample(cfg, rng, 3, 5, {}, 2),
      make_sample(cfg, rng, 9, 8, {{1, 2, 2}, {1, 6, 4}}, 3),
  };
  MicroBatch mb = build_micro_batch(samples, cfg, kPad);
  int64_t len = 0;
  for (const auto& s : samples) len = std::max<int64_t>(len, s.input_ids.size());
  ASSERT_EQ(mb.batch.input_ids.sizes(), (std::vector<int64_t>{3, len}));
  ASSERT_EQ(mb.batch.position_ids.sizes(), (std::vector<int64_t>{3, 3, len}));
  EXPECT_EQ(mb.indices, (std::vector<int64_t>{7, 3, 9}));
  EXPECT_EQ(mb.n_images, 3);
  EXPECT_EQ(mb.supervised_tokens, 5 + 2 + 3);
  EXPECT_FALSE(mb.filler);

  for (int64_t r = 0; r < 3; ++r) {
    const auto& s = samples[r];
    int64_t n = s.input_ids.size();
    for (int64_t t = 0; t < len; ++t) {
      bool real = t < n;
      EXPECT_EQ(mb.batch.input_ids[r][t].item<int64_t>(), real ? s.input_ids[t] : kPad);
      EXPECT_EQ(mb.batch.labels[r][t].item<int64_t>(), real ? s.labels[t] : -100);
      EXPECT_EQ(mb.batch.attention_mask[r][t].item<int64_t>(), real ? 1 : 0);
    }
    // Positions of the real tokens equal those of the sample alone (independent of padding
    // and of the other rows).
    auto ids = torch::tensor(s.input_ids, torch::kLong).view({1, n});
    torch::Tensor grid;
    if (!s.grid_thw.empty()) {
      std::vector<int64_t> flat;
      for (const auto& g : s.grid_thw) flat.insert(flat.end(), g.begin(), g.end());
      grid = torch::tensor(flat, torch::kLong).view({-1, 3});
    }
    auto alone = vlm::get_rope_index(ids, grid, torch::ones({1, n}, torch::kLong), cfg).position_ids;
    EXPECT_TRUE(torch::equal(mb.batch.position_ids.index({torch::indexing::Slice(), r,
                                                          torch::indexing::Slice(0, n)}),
                             alone.index({torch::indexing::Slice(), 0})))
        << "row " << r;
  }
  // Pixels concatenated in row order, grids likewise.
  EXPECT_TRUE(torch::equal(mb.batch.pixel_values,
                           torch::cat({samples[0].pixel_values, samples[2].pixel_values}, 0)));
  EXPECT_TRUE(torch::equal(mb.batch.image_grid_thw,
                           torch::tensor({1, 4, 6, 1, 2, 2, 1, 6, 4}, torch::kLong).view({3, 3})));
  // Vision attention blocks: one per image frame, in patches (4*6, 2*2, 6*4).
  EXPECT_TRUE(torch::equal(mb.cu_seqlens, torch::tensor({0, 24, 28, 52}, torch::kLong)));
}

TEST(MicroBatch, RejectsInconsistentSamples) {
  auto cfg = vlm::preset("tiny");
  std::mt19937_64 rng(2);
  auto s = make_sample(cfg, rng, 1, 6, {{1, 4, 4}}, 2);
  auto bad = s;
  bad.labels.pop_back();
  EXPECT_THROW(build_micro_batch({bad}, cfg, kPad), vlm::Error);
  bad = s;
  bad.pixel_values = bad.pixel_values.slice(0, 0, 8);
  EXPECT_THROW(build_micro_batch({bad}, cfg, kPad), vlm::Error);
  bad = s;
  bad.grid_thw[0] = {1, 4, 8};  // pads no longer match the grid
  bad.pixel_values = torch::randn({32, 1176});
  EXPECT_THROW(build_micro_batch({bad}, cfg, kPad), vlm::Error);
}

// Records the units a forward pass runs.
struct RecordingRunner : vlm::UnitRunner {
  std::vector<std::string> calls;
  torch::Tensor run(const std::string& path, torch::nn::Module& unit, const torch::Tensor& x,
                    const std::function<torch::Tensor(const torch::Tensor&)>& fn) override {
    calls.push_back(path);
    return fn(x);
  }
};

TEST(MicroBatch, FillerRunsEveryUnitAndContributesNothing) {
  auto model = tiny_model();
  auto runner = std::make_shared<RecordingRunner>();
  model->set_runner(runner);
  MicroBatch filler = filler_micro_batch(kPad);
  EXPECT_TRUE(filler.filler);
  EXPECT_EQ(filler.supervised_tokens, 0);
  auto out = model->forward(filler.batch);
  EXPECT_EQ(out.n_tokens, 0);
  EXPECT_EQ(out.loss_sum.item<float>(), 0.0f);
  std::vector<std::string> expected;
  for (const auto& u : model->units()) expected.push_back(u.path);
  EXPECT_EQ(runner->calls, expected);
  // Backward reaches every parameter (zeros), so a reducer has the same work on every rank.
  out.loss_sum.backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_EQ(p.value().grad().abs().max().item<float>(), 0.0f) << p.key();
  }
}

TEST(MicroBatch, StepLossAcrossRanksEqualsOneProcessOnTheGlobalBatch) {
  auto cfg = vlm::preset("tiny");
  auto model = tiny_model();
  std::mt19937_64 rng(5);
  // Mixed step: text-only, one image, several images, long and short texts.
  std::vector<vlm::TokenizedSample> samples;
  std::vector<SampleCost> costs;
  for (int i = 0; i < 11; ++i) {
    std::vector<std::array<int64_t, 3>> grids;
    int kind = i % 4;
    if (kind == 1) grids = {{1, 4, 6}};
    if (kind == 2) grids = {{1, 2, 2}, {1, 4, 4}, {1, 6, 2}};
    if (kind == 3) grids = {{1, 8, 8}};
    samples.push_back(make_sample(cfg, rng, i, 6 + (i * 7) % 30, grids, 1 + i % 5));
    costs.push_back(vlm::test::synthetic_cost(samples.back()));
  }
  Budgets b = vlm::test::synthetic_budgets();  // max_tokens 120 forces several micro-batches per rank

  torch::NoGradGuard no_grad;
  // One process, the whole global batch at once.
  MicroBatch all = build_micro_batch(samples, cfg, kPad);
  auto ref = model->forward(all.batch);
  double ref_loss = ref.loss_sum.item<double>() / ref.n_tokens;
  ASSERT_EQ(ref.n_tokens, all.supervised_tokens);

  for (int world : {2, 3, 4}) {
    StepPlan plan = plan_step(costs, world, b);
    ASSERT_TRUE(plan.skipped.empty());
    double loss_sum = 0;
    int64_t tokens = 0, micro = 0;
    std::set<int64_t> seen;
    for (const auto& rank : plan.ranks) {
      ASSERT_EQ(static_cast<int64_t>(rank.micro_batches.size()), plan.micro_batches);
      for (const auto& mbp : rank.micro_batches) {
        MicroBatch mb;
        if (mbp.filler()) {
          mb = filler_micro_batch(kPad);
        } else {
          std::vector<vlm::TokenizedSample> rows;
          for (const auto& ps : mbp.samples) {
            EXPECT_FALSE(ps.truncated);
            rows.push_back(samples[ps.index]);
            seen.insert(ps.index);
            EXPECT_EQ(ps.seq_len, static_cast<int64_t>(samples[ps.index].input_ids.size()));
          }
          mb = build_micro_batch(rows, cfg, kPad);
          EXPECT_LE(mb.batch.input_ids.numel(), b.max_tokens);
        }
        auto out = model->forward(mb.batch);
        EXPECT_EQ(out.n_tokens, mb.supervised_tokens);
        loss_sum += out.loss_sum.item<double>();
        tokens += out.n_tokens;
        ++micro;
      }
    }
    EXPECT_EQ(seen.size(), samples.size());
    EXPECT_GT(micro, world);  // the budgets really split the step
    EXPECT_EQ(tokens, ref.n_tokens);
    EXPECT_NEAR(loss_sum / tokens, ref_loss, 1e-6 * std::abs(ref_loss)) << "world " << world;
  }
}

}  // namespace
