// sharding/parallel/cpu_pieces.h: sum_of_squares (the gradient norm's sum) against torch in float64
// (t.to(kFloat64).square().sum(), an independent reduction): fp32 tensors whose sizes hit
// the 16-lane tails and span several pieces, bf16, and an empty one, within 1e-12 relative;
// the same bits on 1 and 2 intra-op threads; NaN and Inf propagate.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "sharding/parallel/cpu_pieces.h"

namespace {

using vlm::sharding::kPiece;
using vlm::sharding::sum_of_squares;

double reference(const std::vector<torch::Tensor>& parts) {
  double s = 0;
  for (const auto& t : parts) s += t.to(torch::kFloat64).square().sum().item<double>();
  return s;
}

std::vector<torch::Tensor> mixed_parts() {
  torch::manual_seed(3);
  std::vector<torch::Tensor> parts;
  for (int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(1000), kPiece - 3, 2 * kPiece + 29, int64_t(0)})
    parts.push_back(torch::randn({n}) * 3);
  parts.push_back(torch::randn({33, 7}));                            // 2-d
  parts.push_back(torch::randn({4099}).to(torch::kBFloat16));        // the fp64-copy path
  parts.push_back(torch::randn({40, 50}).t());                       // not contiguous
  return parts;
}

TEST(CpuPieces, SumOfSquaresMatchesTorchInFloat64) {
  const auto parts = mixed_parts();
  const double want = reference(parts);
  const double got = sum_of_squares(parts);
  EXPECT_NEAR(got, want, 1e-12 * want);
  for (const auto& t : parts) {  // one tensor at a time, too
    const double w = reference({t});
    EXPECT_NEAR(sum_of_squares({t}), w, 1e-12 * std::max(w, 1e-300)) << t.sizes();
  }
}

TEST(CpuPieces, SumOfSquaresIsTheSameOnOneAndTwoThreads) {
  const int before = at::get_num_threads();
  const auto parts = mixed_parts();
  at::set_num_threads(1);
  const double one = sum_of_squares(parts);
  at::set_num_threads(2);
  const double two = sum_of_squares(parts);
  at::set_num_threads(before);
  EXPECT_EQ(one, two);
}

TEST(CpuPieces, SumOfSquaresPropagatesNanAndInf) {
  auto t = torch::randn({3 * kPiece});
  t[kPiece + 5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(sum_of_squares({t})));
  t[kPiece + 5] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(sum_of_squares({t})));
  t[kPiece + 5] = 1e30f;  // fp32 would overflow at 1e30^2; fp64 does not
  const double big = double(1e30f) * double(1e30f);
  EXPECT_NEAR(sum_of_squares({t}), big, 1e-12 * big);
}

}  // namespace
