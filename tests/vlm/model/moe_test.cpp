// The sparse MoE block's pieces (vlm/model/moe.h) against plain formulas: the experts'
// output and gradients against a per-token loop written from the definition (float64), on
// both compute paths (at::_grouped_mm for aligned fp32 rows on the CPU, the per-expert GEMM
// loop otherwise), with experts that get no row; keep_experts; the load-balancing state's
// value and gradient against the formula. The whole block against transformers is
// HfParity/MixtureOfExperts.* and HfParityMoeAux.* (hf_parity_test.cpp).
#include <gtest/gtest.h>

#include "vlm/model/meta_init.h"
#include "vlm/model/moe.h"

namespace {

// sum_k w[t, k] * expert_{idx[t, k]}(x[t]), one token and one expert at a time.
torch::Tensor moe_by_definition(const torch::Tensor& x, const torch::Tensor& idx, const torch::Tensor& w,
                                const torch::Tensor& gate_up, const torch::Tensor& down) {
  const int64_t inter = down.size(2);
  std::vector<torch::Tensor> rows;
  for (int64_t t = 0; t < x.size(0); ++t) {
    auto acc = torch::zeros({x.size(1)}, x.options());
    for (int64_t k = 0; k < idx.size(1); ++k) {
      const int64_t e = idx[t][k].item<int64_t>();
      const auto gu = torch::mv(gate_up[e], x[t]);
      const auto a = torch::silu(gu.narrow(0, 0, inter)) * gu.narrow(0, inter, inter);
      acc = acc + w[t][k] * torch::mv(down[e], a);
    }
    rows.push_back(acc);
  }
  return torch::stack(rows);
}

// fp32 experts (grouped GEMM when `aligned`, else the loop) against the float64 definition:
// output and the gradients of x, the routing weights and both expert tensors.
void check_experts(int64_t d, bool aligned) {
  SCOPED_TRACE("d = " + std::to_string(d) + (aligned ? " (grouped GEMM)" : " (per-expert loop)"));
  torch::manual_seed(3);
  const int64_t n = 20, e = 6, k = 2, inter = 8;
  vlm::MoeExperts m(e, d, inter, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 5, 0.3});
  auto x = torch::randn({n, d}).requires_grad_(true);
  // Experts 4 and 5 get no row; expert 0 gets most.
  auto idx = torch::randint(0, 4, {n, k}, torch::kInt64);
  idx.select(1, 0).fill_(0);
  idx.select(1, 1).clamp_(1, 3);
  auto w = torch::rand({n, k}).requires_grad_(true);
  auto y = m(x, idx, w);
  const auto g = torch::randn_like(y);
  (y * g).sum().backward();

  auto x64 = x.detach().to(torch::kFloat64).requires_grad_(true);
  auto w64 = w.detach().to(torch::kFloat64).requires_grad_(true);
  auto gu64 = m->gate_up_proj.detach().to(torch::kFloat64).requires_grad_(true);
  auto dn64 = m->down_proj.detach().to(torch::kFloat64).requires_grad_(true);
  auto y64 = moe_by_definition(x64, idx, w64, gu64, dn64);
  (y64 * g.to(torch::kFloat64)).sum().backward();
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kFloat64) - b).abs().max().item<double>() / b.abs().max().item<double>();
  };
  EXPECT_LE(rel(y.detach(), y64.detach()), 1e-6);
  EXPECT_LE(rel(x.grad(), x64.grad()), 1e-6);
  EXPECT_LE(rel(w.grad(), w64.grad()), 1e-6);
  EXPECT_LE(rel(m->gate_up_proj.grad(), gu64.grad()), 1e-6);
  EXPECT_LE(rel(m->down_proj.grad(), dn64.grad()), 1e-6);
  // Unrouted experts: zero gradient (the definition gives exactly 0 there).
  EXPECT_EQ(m->gate_up_proj.grad().narrow(0, 4, 2).abs().max().item<double>(), 0.0);
}

}  // namespace

TEST(MoeExperts, GroupedGemmAndLoopEqualTheDefinition) {
  check_experts(16, /*aligned=*/true);   // 16 fp32 = 64 bytes: at::_grouped_mm
  check_experts(14, /*aligned=*/false);  // 56 bytes per row: the per-expert loop
}

TEST(MoeExperts, KeepExpertsNarrowsToTheHeldSlice) {
  vlm::MoeExperts m(8, 16, 4, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 1, 0.02});
  const auto whole = m->gate_up_proj.detach().clone();
  m->keep_experts(2, 3);
  EXPECT_EQ(m->held(), 3);
  EXPECT_EQ(m->first_expert, 2);
  EXPECT_TRUE(torch::equal(m->gate_up_proj.detach(), whole.narrow(0, 2, 3)));
  EXPECT_TRUE(m->gate_up_proj.requires_grad());
  EXPECT_EQ(m->named_parameters()["down_proj"].size(0), 3);
  // Without a dispatcher a split module refuses to run.
  EXPECT_THROW(m(torch::randn({2, 16}), torch::zeros({2, 1}, torch::kInt64), torch::ones({2, 1})), std::exception);
  EXPECT_THROW(m->keep_experts(0, 1), std::exception);  // already split
}

TEST(MoeAux, FinishGivesTheSwitchLossAndItsGradient) {
  // Two layers, E = 3, 4 real tokens: aux = E sum_e (C_e / R)(P_e / R), R = tokens x layers.
  vlm::RouterAuxState s;
  s.aux_weight = 0.5;
  s.rows = torch::full({}, 4.0);
  s.grad = torch::zeros({3});
  s.counts = {torch::tensor({4.0, 3.0, 1.0}), torch::tensor({2.0, 2.0, 4.0})};
  s.prob_sums = {torch::tensor({1.5, 1.5, 1.0}), torch::tensor({1.0, 1.0, 2.0})};
  const double aux = s.finish(3).item<double>();
  const double r = 8;
  const double want = 3 * ((6 / r) * (2.5 / r) + (5 / r) * (2.5 / r) + (5 / r) * (3.0 / r));
  EXPECT_NEAR(aux, want, 1e-12);
  EXPECT_FALSE(s.recording);
  const auto expect_grad = torch::tensor({6.0, 5.0, 5.0}) * (0.5 * 3 / (r * r));
  EXPECT_TRUE(torch::allclose(s.grad, expect_grad, 0, 1e-12)) << s.grad;
}
