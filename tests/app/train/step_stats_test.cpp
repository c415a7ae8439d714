// StepStats against its documented layout (app/train/step_stats.h): the pack / unpack round
// trip, the field order of the reduced tensor, and sum reduction as field-wise addition.
#include <gtest/gtest.h>

#include "app/train/step_stats.h"
#include "sharding/dist/parallel_dims.h"

namespace {

using vlm::app::StepStats;

// Distinct values in every field; `k` shifts them so two instances differ everywhere.
StepStats step_stats_sample(int64_t k) {
  StepStats s;
  s.loss_sum = 123.25 + static_cast<double>(k);
  s.samples = 8 + k;
  s.images = 5 + k;
  s.llm_tokens = 4096 + k;
  s.flops = 3.5e12 + static_cast<double>(k);
  s.dropped = 1 + k;
  s.stop_requests = k % 2;
  s.padding_tokens = (int64_t{1} << 51) + k;  // large, and sums of two stay below 2^53 (exact in float64)
  s.padding = 77 + k;
  return s;
}

void expect_same_step_stats(const StepStats& a, const StepStats& b) {
  EXPECT_EQ(a.loss_sum, b.loss_sum);
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.images, b.images);
  EXPECT_EQ(a.llm_tokens, b.llm_tokens);
  EXPECT_EQ(a.flops, b.flops);
  EXPECT_EQ(a.dropped, b.dropped);
  EXPECT_EQ(a.stop_requests, b.stop_requests);
  EXPECT_EQ(a.padding_tokens, b.padding_tokens);
  EXPECT_EQ(a.padding, b.padding);
}

TEST(StepStats, PackUnpackRoundTrip) {
  for (int64_t k : {0, 1, 1000}) {
    SCOPED_TRACE(k);
    const StepStats a = step_stats_sample(k);
    expect_same_step_stats(StepStats::unpack(a.pack()), a);
  }
  expect_same_step_stats(StepStats::unpack(StepStats{}.pack()), StepStats{});
}

TEST(StepStats, PackedLayoutIsTheDocumentedOrder) {
  const StepStats a = step_stats_sample(3);
  const torch::Tensor t = a.pack();
  ASSERT_EQ(t.dim(), 1);
  ASSERT_EQ(t.size(0), StepStats::kFields);
  EXPECT_EQ(t.scalar_type(), torch::kFloat64);
  EXPECT_TRUE(t.device().is_cpu());
  auto v = t.accessor<double, 1>();
  EXPECT_EQ(v[0], a.loss_sum);
  EXPECT_EQ(v[1], static_cast<double>(a.samples));
  EXPECT_EQ(v[2], static_cast<double>(a.images));
  EXPECT_EQ(v[3], static_cast<double>(a.llm_tokens));
  EXPECT_EQ(v[4], a.flops);
  EXPECT_EQ(v[5], static_cast<double>(a.dropped));
  EXPECT_EQ(v[6], static_cast<double>(a.stop_requests));
  EXPECT_EQ(v[7], static_cast<double>(a.padding_tokens));
  EXPECT_EQ(v[8], static_cast<double>(a.padding));
}

TEST(StepStats, SumOfPackedIsTheFieldWiseSum) {
  const StepStats a = step_stats_sample(0), b = step_stats_sample(1);  // stop_requests 0 and 1
  const StepStats sum = StepStats::unpack(a.pack() + b.pack());
  StepStats want;
  want.loss_sum = a.loss_sum + b.loss_sum;
  want.samples = a.samples + b.samples;
  want.images = a.images + b.images;
  want.llm_tokens = a.llm_tokens + b.llm_tokens;
  want.flops = a.flops + b.flops;
  want.dropped = a.dropped + b.dropped;
  want.stop_requests = a.stop_requests + b.stop_requests;
  want.padding_tokens = a.padding_tokens + b.padding_tokens;
  want.padding = a.padding + b.padding;
  expect_same_step_stats(sum, want);
  // One rank's request stops every rank; none stops none.
  EXPECT_TRUE(sum.stop());
  EXPECT_FALSE(StepStats::unpack(a.pack() + a.pack()).stop());
}

TEST(StepStats, ReduceOnOneRankIsTheIdentity) {
  vlm::sharding::ParallelDims dims =
      vlm::sharding::ParallelDims::init(vlm::sharding::detect_dist_env({}), vlm::sharding::ParallelOptions{});
  const StepStats a = step_stats_sample(7);
  expect_same_step_stats(vlm::app::reduce_step_stats(dims.control(), a, "step 1"), a);
}

TEST(StepStats, UnpackRejectsOtherShapes) {
  EXPECT_THROW(StepStats::unpack(torch::zeros({StepStats::kFields - 1}, torch::kFloat64)), std::exception);
  EXPECT_THROW(StepStats::unpack(torch::zeros({1, StepStats::kFields}, torch::kFloat64)), std::exception);
  EXPECT_THROW(StepStats::unpack(torch::Tensor()), std::exception);
}

}  // namespace
