// Packed-row attention of the LLM (issue #27): varlen_attention with causal = true equals
// an explicit softmax per head under a block-diagonal causal mask (query i of a segment
// sees keys of its own segment up to i), with GQA (query head j reads kv head j / 2) and
// segments of equal and unequal lengths (batched and single calls). fp32, 1e-5 relative.
#include <gtest/gtest.h>

#include "vlm/model/attention.h"

namespace varlen_causal_test {

TEST(VarlenCausalAttention, EqualsDenseBlockDiagonalCausalWithGqa) {
  torch::manual_seed(4);
  const std::vector<int64_t> cu{0, 5, 10, 11, 18, 25, 28};  // lengths 5, 5, 1, 7, 7, 3
  const int64_t s = cu.back(), h = 4, hkv = 2, d = 8;
  const double scale = 0.35;
  auto q = torch::randn({s, h, d}), k = torch::randn({s, hkv, d}), v = torch::randn({s, hkv, d});
  auto got = vlm::varlen_attention(q, k, v, cu, scale, /*causal=*/true);  // [S, H, D]
  ASSERT_EQ(got.sizes(), q.sizes());
  auto seg = torch::zeros({s}, torch::kInt64);
  for (size_t i = 0; i + 1 < cu.size(); ++i) seg.narrow(0, cu[i], cu[i + 1] - cu[i]).fill_(static_cast<int64_t>(i));
  auto pos = torch::arange(s);
  auto allowed = (seg.unsqueeze(1) == seg.unsqueeze(0)).logical_and(pos.unsqueeze(0) <= pos.unsqueeze(1));  // [S, S]
  for (int64_t j = 0; j < h; ++j) {
    auto sc = torch::matmul(q.select(1, j), k.select(1, j / (h / hkv)).t()) * scale;
    sc = sc.masked_fill(allowed.logical_not(), -1e30);
    auto want = torch::matmul(torch::softmax(sc, -1), v.select(1, j / (h / hkv)));
    EXPECT_TRUE(torch::allclose(got.select(1, j), want, 1e-5, 1e-6))
        << "head " << j << ": max diff " << (got.select(1, j) - want).abs().max().item<double>();
  }
}

}  // namespace varlen_causal_test
