// Padding-free packing (issue #27): the packed micro-batch's layout (one row, text
// cu_seqlens, first-token labels masked, positions restarting per sample), the step plan
// with batch.packing (no padding, sum of lengths under max_tokens, same micro-batch count on
// every rank), and the model on packed rows: loss and every parameter gradient equal to the
// padded build of the same samples, for the tiny Qwen2-VL, Qwen2.5-VL (window attention) and
// Qwen3-VL (DeepStack) presets, in fp32 within 1e-5 relative.
#include <gtest/gtest.h>

#include <climits>
#include <iostream>
#include <map>
#include <random>

#include "collate/micro_batch.h"
#include "collate/step_plan.h"
#include "tests/collate/synthetic.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/rope_index.h"

using namespace vlm::collate;
using torch::indexing::Slice;

namespace packing_test {

// A mix of lengths, images (one, two, none) and text-only samples; `n` samples.
std::vector<vlm::TokenizedSample> mixed_samples(const vlm::VlmConfig& cfg, uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  const std::vector<std::vector<std::array<int64_t, 3>>> images = {
      {{1, 4, 6}}, {}, {{1, 2, 2}, {1, 6, 4}}, {}, {{1, 4, 4}}, {{1, 8, 4}}, {}};
  std::vector<vlm::TokenizedSample> out;
  for (int i = 0; i < n; ++i) {
    const int64_t text = 3 + (i * 7) % 23;
    out.push_back(vlm::test::synthetic_sample(cfg, rng, 100 + i, text, images[i % images.size()], 1 + i % 5));
  }
  return out;
}

vlm::VisionLanguageModel seeded_model(const std::string& preset) {
  vlm::VisionLanguageModel model(vlm::preset(preset));
  vlm::MaterializeOptions opts;
  opts.seed = 17;
  vlm::materialize(*model, opts);
  return model;
}

// Sum of loss_sum over the micro-batches, with the gradients of the sum (accumulated).
struct LossGrads {
  double loss = 0;
  int64_t tokens = 0;
  std::map<std::string, torch::Tensor> grads;
};

LossGrads run_micro_batches(vlm::VisionLanguageModel& model, const std::vector<MicroBatch>& mbs) {
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  LossGrads r;
  for (const auto& mb : mbs) {
    auto out = model->forward(mb.batch);
    out.loss_sum.backward();
    r.loss += out.loss_sum.item<double>();
    r.tokens += out.n_tokens;
  }
  for (const auto& p : model->named_parameters())
    r.grads[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::zeros_like(p.value());
  return r;
}

// max over parameters of max|a - b| / max|b| (a parameter whose reference gradient is
// exactly zero must match exactly: its entry is then max|a|).
double max_relative_grad_diff(const LossGrads& a, const LossGrads& b, std::string* worst) {
  double m = 0;
  for (const auto& [name, gb] : b.grads) {
    const auto& ga = a.grads.at(name);
    const double scale = gb.abs().max().item<double>();
    const double diff = (ga - gb).abs().max().item<double>();
    const double rel = scale > 0 ? diff / scale : diff;
    if (rel > m) m = rel, *worst = name;
  }
  return m;
}

void expect_packed_equals_padded(const std::string& preset, uint64_t seed) {
  auto model = seeded_model(preset);
  const auto cfg = model->cfg;
  auto samples = mixed_samples(cfg, seed, 9);
  // One micro-batch each way, and a plan of several micro-batches each way.
  const LossGrads padded = run_micro_batches(model, {build_micro_batch(samples, cfg, 0)});
  const LossGrads packed = run_micro_batches(model, {build_packed_micro_batch(samples, cfg)});
  ASSERT_EQ(packed.tokens, padded.tokens);
  ASSERT_GT(padded.tokens, 0);
  const double loss_rel = std::abs(packed.loss - padded.loss) / std::abs(padded.loss);
  std::string worst;
  const double grad_rel = max_relative_grad_diff(packed, padded, &worst);
  std::cout << preset << ": packed vs padded (one micro-batch of " << samples.size() << " samples, "
            << padded.tokens << " supervised tokens): loss rel diff " << loss_rel << ", max grad rel diff "
            << grad_rel << " (" << worst << ", " << padded.grads.size() << " parameters)\n";
  EXPECT_LE(loss_rel, 1e-5);
  EXPECT_LE(grad_rel, 1e-5) << worst;

  // Negative control: the same row without its segments (one causal sequence, samples
  // seeing earlier samples) gives another loss, so the comparison above can fail.
  MicroBatch leaky = build_packed_micro_batch(samples, cfg);
  leaky.batch.text_cu_seqlens = torch::Tensor();
  torch::NoGradGuard no_grad;
  const double leaky_loss = model->forward(leaky.batch).loss_sum.item<double>();
  std::cout << preset << ": without text cu_seqlens the loss moves by "
            << std::abs(leaky_loss - padded.loss) / std::abs(padded.loss) << " relative\n";
  EXPECT_GT(std::abs(leaky_loss - padded.loss) / std::abs(padded.loss), 1e-3);
}

TEST(PackedMicroBatch, OneRowWithSegmentsLabelsAndPositions) {
  auto cfg = vlm::preset("tiny");
  auto samples = mixed_samples(cfg, 3, 5);
  MicroBatch packed = build_packed_micro_batch(samples, cfg);
  MicroBatch padded = build_micro_batch(samples, cfg, 0);
  std::vector<int64_t> cu = {0};
  for (const auto& s : samples) cu.push_back(cu.back() + static_cast<int64_t>(s.input_ids.size()));
  const int64_t L = cu.back();
  ASSERT_EQ(packed.batch.input_ids.sizes(), (std::vector<int64_t>{1, L}));
  ASSERT_EQ(packed.batch.position_ids.sizes(), (std::vector<int64_t>{3, 1, L}));
  EXPECT_TRUE(torch::equal(packed.batch.text_cu_seqlens, torch::tensor(cu, torch::kLong)));
  EXPECT_EQ(packed.batch.attention_mask.sum().item<int64_t>(), L);  // no padding at all
  EXPECT_EQ(packed.supervised_tokens, padded.supervised_tokens);
  EXPECT_EQ(packed.batch.loss_rows.size(0), packed.supervised_tokens);
  EXPECT_EQ(packed.indices, padded.indices);
  EXPECT_EQ(packed.n_images, padded.n_images);
  EXPECT_TRUE(torch::equal(packed.batch.pixel_values, padded.batch.pixel_values));
  EXPECT_TRUE(torch::equal(packed.batch.image_grid_thw, padded.batch.image_grid_thw));
  EXPECT_TRUE(torch::equal(packed.cu_seqlens, padded.cu_seqlens));  // vision: unchanged
  EXPECT_EQ(padding_count(packed).padding, 0);
  EXPECT_EQ(padding_count(padded).tokens, padded.batch.input_ids.numel());

  int64_t image_row = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    const int64_t n = static_cast<int64_t>(s.input_ids.size());
    auto seg = Slice(cu[i], cu[i + 1]);
    EXPECT_TRUE(torch::equal(packed.batch.input_ids.index({0, seg}), torch::tensor(s.input_ids, torch::kLong)));
    // Labels: the sample's own, except its first token (never a target across a boundary).
    auto want = torch::tensor(s.labels, torch::kLong);
    want[0] = -100;
    EXPECT_TRUE(torch::equal(packed.batch.labels.index({0, seg}), want)) << "sample " << i;
    // Positions: get_rope_index of the sample alone, restarting at 0.
    torch::Tensor grid;
    if (!s.grid_thw.empty()) {
      grid = packed.batch.image_grid_thw.narrow(0, image_row, static_cast<int64_t>(s.grid_thw.size()));
      image_row += static_cast<int64_t>(s.grid_thw.size());
    }
    auto alone = vlm::get_rope_index(torch::tensor(s.input_ids, torch::kLong).view({1, n}), grid, {}, cfg);
    EXPECT_TRUE(torch::equal(packed.batch.position_ids.index({Slice(), 0, seg}), alone.position_ids.index({Slice(), 0})))
        << "sample " << i;
    EXPECT_EQ(packed.batch.position_ids[0][0][cu[i]].item<int64_t>(), 0) << "sample " << i;
  }
}

TEST(PackedMicroBatch, LengthMismatchIsAnError) {
  auto cfg = vlm::preset("tiny");
  auto samples = mixed_samples(cfg, 4, 2);
  samples[1].labels.pop_back();
  EXPECT_THROW(build_packed_micro_batch(samples, cfg), vlm::Error);
}

TEST(PackedStepPlan, NoPaddingSameCountsAndEverySampleOnce) {
  auto cfg = vlm::preset("tiny");
  for (int world : {1, 2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    auto samples = mixed_samples(cfg, 10 + world, 30);
    std::vector<SampleCost> costs;
    for (const auto& s : samples) costs.push_back(vlm::test::synthetic_cost(s));
    Budgets b = vlm::test::synthetic_budgets();
    const StepPlan padded = plan_step(costs, world, b);
    b.packing = true;
    const StepPlan packed = plan_step(costs, world, b);
    std::map<int64_t, int> seen;
    for (size_t r = 0; r < packed.ranks.size(); ++r) {
      const auto& rp = packed.ranks[r];
      EXPECT_EQ(static_cast<int64_t>(rp.micro_batches.size()), packed.micro_batches);
      // Rank assignment (and so the balance) is that of the padded plan.
      EXPECT_EQ(rp.cost, padded.ranks[r].cost);
      for (const auto& mb : rp.micro_batches) {
        if (mb.filler()) continue;
        int64_t sum = 0, images = 0;
        for (const auto& s : mb.samples) sum += s.seq_len, images += s.image_tokens, ++seen[s.index];
        EXPECT_TRUE(mb.packed);
        EXPECT_EQ(mb.tokens, sum);
        EXPECT_EQ(mb.padded_tokens(), sum);
        EXPECT_LE(sum, b.max_tokens);
        EXPECT_LE(images, b.batch_image_tokens);
        EXPECT_EQ(plan_padding(mb).padding, 0);
      }
    }
    // Balance (greedy least-loaded bound): ranks' packed costs differ by at most one sample's.
    int64_t most = 0, least = INT64_MAX, biggest = 0;
    for (const auto& rp : packed.ranks) most = std::max(most, rp.cost), least = std::min(least, rp.cost);
    for (const auto& rp : packed.ranks)
      for (const auto& mb : rp.micro_batches)
        for (const auto& s : mb.samples) biggest = std::max(biggest, sample_cost(s));
    EXPECT_LE(most - least, biggest);
    EXPECT_EQ(seen.size(), samples.size());
    for (const auto& [idx, n] : seen) EXPECT_EQ(n, 1) << "sample " << idx;
    EXPECT_LE(packed.micro_batches, padded.micro_batches);
    const PaddingCount pp = plan_padding(packed), pd = plan_padding(padded);
    EXPECT_LT(pp.fraction(), pd.fraction());
    std::cout << "world " << world << ": padding " << 100 * pd.fraction() << "% padded ("
              << padded.micro_batches << " micro-batches/rank), " << 100 * pp.fraction() << "% packed ("
              << packed.micro_batches << ", fillers only)\n";
  }
}

TEST(PackedModel, LossAndEveryGradientEqualPaddedTiny) { expect_packed_equals_padded("tiny", 5); }

TEST(PackedModel, LossAndEveryGradientEqualPaddedQwen3DeepStack) { expect_packed_equals_padded("tiny-qwen3", 6); }

TEST(PackedModel, LossAndEveryGradientEqualPaddedQwen25Windows) { expect_packed_equals_padded("tiny-qwen2.5", 7); }

// Qwen3.5: the Gated DeltaNet layers restart their conv and recurrent state at every packed
// sample (as at the start of a padded row).
TEST(PackedModel, LossAndEveryGradientEqualPaddedQwen35LinearAttention) {
  expect_packed_equals_padded("tiny-qwen3.5", 8);
}

// Whole steps: the padded plan's micro-batches and the packed plan's (other groupings of
// the same samples) give the same summed loss and gradients, fillers included.
TEST(PackedModel, PlannedStepEqualsPaddedStep) {
  auto model = seeded_model("tiny");
  const auto cfg = model->cfg;
  auto samples = mixed_samples(cfg, 21, 14);
  std::map<int64_t, const vlm::TokenizedSample*> by_index;
  std::vector<SampleCost> costs;
  for (const auto& s : samples) by_index[s.index] = &s, costs.push_back(vlm::test::synthetic_cost(s));
  auto build = [&](bool packing) {
    Budgets b = vlm::test::synthetic_budgets();
    b.packing = packing;
    const StepPlan plan = plan_step(costs, 2, b);
    std::vector<MicroBatch> mbs;
    for (const auto& rp : plan.ranks)
      for (const auto& mbp : rp.micro_batches) {
        if (mbp.filler()) {
          mbs.push_back(filler_micro_batch(0));
          continue;
        }
        std::vector<vlm::TokenizedSample> rows;
        for (const auto& ps : mbp.samples) rows.push_back(*by_index.at(ps.index));
        mbs.push_back(packing ? build_packed_micro_batch(rows, cfg) : build_micro_batch(rows, cfg, 0));
      }
    return mbs;
  };
  const LossGrads padded = run_micro_batches(model, build(false));
  const LossGrads packed = run_micro_batches(model, build(true));
  ASSERT_EQ(packed.tokens, padded.tokens);
  std::string worst;
  const double grad_rel = max_relative_grad_diff(packed, padded, &worst);
  const double loss_rel = std::abs(packed.loss - padded.loss) / std::abs(padded.loss);
  std::cout << "planned step (2 ranks): loss rel diff " << loss_rel << ", max grad rel diff " << grad_rel << "\n";
  EXPECT_LE(loss_rel, 1e-5);
  EXPECT_LE(grad_rel, 1e-5) << worst;
}

}  // namespace packing_test
