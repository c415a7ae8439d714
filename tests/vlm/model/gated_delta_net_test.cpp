// Gated DeltaNet (vlm/model/gated_delta_net.h) against its definition: the chunked rule (what
// training runs; HF parity in hf_parity_test) equals the token-by-token recurrence (the
// rule as written, what decoding runs) in output, final state and every input gradient, for
// lengths that are not whole chunks, GQA-style key heads and a non-zero initial state;
// splitting a sequence and carrying the state (conv and recurrent) equals one pass; a packed
// row (cu_seqlens) equals its samples run one by one; left padding leaves real tokens alone.
#include <gtest/gtest.h>

#include "vlm/model/config.h"
#include "vlm/model/gated_delta_net.h"
#include "vlm/model/meta_init.h"

namespace {

struct RuleInputs {
  torch::Tensor q, k, v, g, beta, s0;
};

// B = 2 rows, Hk = 2 key heads serving Hv = 4 value heads, Dk = 8, Dv = 16.
RuleInputs random_inputs(int64_t length, bool grad) {
  torch::manual_seed(11);
  RuleInputs r;
  auto o = torch::TensorOptions().dtype(torch::kFloat32).requires_grad(grad);
  r.q = torch::randn({2, length, 2, 8}).set_requires_grad(grad);
  r.k = torch::randn({2, length, 2, 8}).set_requires_grad(grad);
  r.v = torch::randn({2, length, 4, 16}).set_requires_grad(grad);
  // Decays in log space: -softplus of something, as the layer makes them (some near 0: long memory).
  r.g = (-torch::nn::functional::softplus(torch::randn({2, length, 4}) * 2 - 1)).set_requires_grad(grad);
  r.beta = torch::rand({2, length, 4}).set_requires_grad(grad);
  r.s0 = torch::randn({2, 4, 8, 16}, o);
  return r;
}

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// Measured (2 cores, fp32): outputs and states 2e-7 .. 6e-7, gradients up to 2e-6.
constexpr double kTol = 1e-5;

TEST(GatedDeltaRule, ChunkedEqualsTheRecurrenceWithGradients) {
  for (int64_t length : {1, 5, 64, 150}) {
    SCOPED_TRACE("length " + std::to_string(length));
    auto a = random_inputs(length, true), b = random_inputs(length, true);
    auto [oa, sa] = vlm::chunk_gated_delta_rule(a.q, a.k, a.v, a.g, a.beta, a.s0);
    auto [ob, sb] = vlm::recurrent_gated_delta_rule(b.q, b.k, b.v, b.g, b.beta, b.s0);
    EXPECT_LE(rel(oa, ob), kTol);
    EXPECT_LE(rel(sa, sb), kTol);
    // One backward through both, with weights on the outputs and the final state.
    torch::manual_seed(3);
    auto wo = torch::randn_like(oa), ws = torch::randn_like(sa);
    ((oa * wo).sum() + (sa * ws).sum()).backward();
    ((ob * wo).sum() + (sb * ws).sum()).backward();
    for (auto [x, y, name] : {std::tuple{a.q, b.q, "q"}, {a.k, b.k, "k"}, {a.v, b.v, "v"}, {a.g, b.g, "g"},
                              {a.beta, b.beta, "beta"}})
      EXPECT_LE(rel(x.grad(), y.grad()), kTol) << "d/d" << name;
  }
}

TEST(GatedDeltaRule, ChunkSizeDoesNotChangeTheResult) {
  auto r = random_inputs(100, false);
  auto [o64, s64] = vlm::chunk_gated_delta_rule(r.q, r.k, r.v, r.g, r.beta, torch::Tensor(), 64);
  auto [o16, s16] = vlm::chunk_gated_delta_rule(r.q, r.k, r.v, r.g, r.beta, torch::Tensor(), 16);
  EXPECT_LE(rel(o16, o64), kTol);
  EXPECT_LE(rel(s16, s64), kTol);
}

TEST(GatedDeltaRule, SplitSequenceWithCarriedStateEqualsOnePass) {
  auto r = random_inputs(90, false);
  auto [whole, s_whole] = vlm::chunk_gated_delta_rule(r.q, r.k, r.v, r.g, r.beta, r.s0);
  auto part = [&](const torch::Tensor& x, int64_t s, int64_t n) { return x.narrow(1, s, n); };
  auto [first, s1] = vlm::chunk_gated_delta_rule(part(r.q, 0, 70), part(r.k, 0, 70), part(r.v, 0, 70),
                                                 part(r.g, 0, 70), part(r.beta, 0, 70), r.s0);
  auto [second, s2] = vlm::chunk_gated_delta_rule(part(r.q, 70, 20), part(r.k, 70, 20), part(r.v, 70, 20),
                                                  part(r.g, 70, 20), part(r.beta, 70, 20), s1);
  EXPECT_LE(rel(torch::cat({first, second}, 1), whole), kTol);
  EXPECT_LE(rel(s2, s_whole), kTol);
}

TEST(CausalConv1d, CarriedStateEqualsOnePassAndZeroStateIsASequenceStart) {
  torch::manual_seed(5);
  auto x = torch::randn({2, 6, 11}), w = torch::randn({6, 1, 4});
  auto [whole, s_whole] = vlm::causal_conv1d_silu(x, w, torch::Tensor());
  auto [a, sa] = vlm::causal_conv1d_silu(x.narrow(2, 0, 7), w, torch::Tensor());
  auto [b, sb] = vlm::causal_conv1d_silu(x.narrow(2, 7, 4), w, sa);
  EXPECT_TRUE(torch::allclose(torch::cat({a, b}, 2), whole, 1e-6, 1e-6));
  EXPECT_TRUE(torch::equal(sb, s_whole));
  EXPECT_TRUE(torch::equal(s_whole, x.narrow(2, 8, 3)));
  // Definition: y[t] = silu(sum_j w[j] x[t - 3 + j]) with x = 0 before the start.
  auto xp = torch::nn::functional::pad(x, torch::nn::functional::PadFuncOptions({3, 0}));
  auto ref = torch::zeros_like(x);
  for (int64_t j = 0; j < 4; ++j) ref = ref + w.select(2, j).unsqueeze(0) * xp.narrow(2, j, 11);
  EXPECT_TRUE(torch::allclose(whole, torch::silu(ref), 1e-5, 1e-6));
}

// A tiny layer with random weights (dt_bias and A_log drawn too).
vlm::GatedDeltaNet make_layer() {
  vlm::TextConfig t;
  t.hidden_size = 32;
  t.linear_num_key_heads = 2;
  t.linear_num_value_heads = 4;
  t.linear_key_head_dim = 8;
  t.linear_value_head_dim = 8;
  t.linear_conv_kernel_dim = 4;
  vlm::GatedDeltaNet m(t, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 9, 0.2});
  torch::NoGradGuard ng;
  m->dt_bias.normal_();
  m->A_log.normal_();
  return m;
}

TEST(GatedDeltaNetLayer, PackedRowEqualsItsSamplesAndLeftPaddingIsInert) {
  auto m = make_layer();
  torch::manual_seed(21);
  auto x = torch::randn({1, 100, 32});
  const std::vector<int64_t> cu{0, 30, 31, 100};
  auto packed = m(x, torch::Tensor(), nullptr, &cu);
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    auto alone = m(x.narrow(1, cu[i], cu[i + 1] - cu[i]), torch::Tensor(), nullptr);
    EXPECT_LE(rel(packed.narrow(1, cu[i], cu[i + 1] - cu[i]), alone), kTol) << "sample " << i;
  }
  // Without the reset the samples would see each other: the packed row must differ from one
  // sequence (the test can tell).
  auto unpacked = m(x, torch::Tensor(), nullptr);
  EXPECT_GT(rel(packed.narrow(1, 30, 70), unpacked.narrow(1, 30, 70)), 1e-3);
  // Left padding: 9 padded positions (any values) before the 30 real tokens of sample 0.
  auto padded = torch::cat({torch::randn({1, 9, 32}), x.narrow(1, 0, 30)}, 1);
  auto mask = torch::cat({torch::zeros({1, 9}), torch::ones({1, 30})}, 1).to(torch::kInt64);
  EXPECT_LE(rel(m(padded, mask, nullptr).narrow(1, 9, 30), packed.narrow(1, 0, 30)), kTol);
}

TEST(GatedDeltaNetLayer, DecodingTokenByTokenEqualsTheSequence) {
  auto m = make_layer();
  torch::NoGradGuard ng;
  torch::manual_seed(22);
  auto x = torch::randn({2, 12, 32});
  auto whole = m(x, torch::Tensor(), nullptr);
  vlm::LinearAttentionState st;
  std::vector<torch::Tensor> outs{m(x.narrow(1, 0, 5), torch::Tensor(), &st)};  // prefill
  for (int64_t t = 5; t < 12; ++t) outs.push_back(m(x.narrow(1, t, 1), torch::Tensor(), &st));
  EXPECT_LE(rel(torch::cat(outs, 1), whole), kTol);
}

}  // namespace
