// vlm/model/recompute_tail.h: inside RecomputeTail(block), residual_linear(block, h, m, out_proj)
// returns h's value with the gradients of h + out_proj(m). Reference: the same expression
// through autograd's own linear (residual_linear outside the guard is exactly that), on the
// same inputs; tolerances stated per dtype. Cases: bias or not, frozen weight, inputs that
// need no gradient, a LoRA adapter with dropout (same RNG state on both sides), bf16; the
// guard only applies to the block it names and only while alive.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "vlm/model/layers.h"
#include "vlm/model/lora.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/recompute_tail.h"

namespace {

struct TailCase {
  bool bias = true;
  bool frozen_weight = false;
  bool h_grad = true, m_grad = true;
  bool lora = false;
  torch::Dtype dtype = torch::kFloat32;
  std::string tag() const {
    return std::string(bias ? "bias" : "no bias") + (frozen_weight ? ", frozen W" : "") + (h_grad ? "" : ", h const") +
           (m_grad ? "" : ", m const") + (lora ? ", LoRA+dropout" : "") + (dtype == torch::kBFloat16 ? ", bf16" : "");
  }
};

struct Grads {
  torch::Tensor value;
  std::vector<torch::Tensor> g;  // dh, dm, dW, db, dA, dB (undefined where none)
};

// One backward of residual_linear with upstream gradient `up`, optionally under the guard.
Grads run_tail(const TailCase& c, bool tail) {
  torch::manual_seed(5);
  vlm::Linear lin(24, 16, c.bias, torch::TensorOptions());
  vlm::materialize(*lin, {torch::kCPU, c.dtype, 3});
  if (c.lora) {
    vlm::LoraOptions o;
    o.r = 4;
    o.dropout = 0.25;
    vlm::add_lora(*lin, o, 11, "blk.mlp.down_proj");
    torch::NoGradGuard ng;
    lin->lora_B->weight.normal_(0, 0.1);  // B = 0 at init would hide B's gradient path
  }
  if (c.frozen_weight) lin->weight.requires_grad_(false);
  auto h = torch::randn({2, 5, 16}).to(c.dtype).requires_grad_(c.h_grad);
  auto m = torch::randn({2, 5, 24}).to(c.dtype).requires_grad_(c.m_grad);
  auto up = torch::randn({2, 5, 16}).to(c.dtype);
  torch::nn::Module block;  // stands for the decoder layer the guard names
  Grads out;
  torch::manual_seed(9);  // the adapter's dropout draws the same mask on both sides
  {
    std::unique_ptr<vlm::RecomputeTail> guard;
    if (tail) guard = std::make_unique<vlm::RecomputeTail>(&block);
    out.value = vlm::residual_linear(&block, h, m, *lin);
  }
  if (!out.value.requires_grad()) return out;
  std::vector<torch::Tensor> wrt{h, m, lin->weight};
  if (c.bias) wrt.push_back(lin->bias);
  if (c.lora) {
    wrt.push_back(lin->lora_A->weight);
    wrt.push_back(lin->lora_B->weight);
  }
  std::vector<torch::Tensor> inputs;
  for (const auto& t : wrt)
    if (t.requires_grad()) inputs.push_back(t);
  auto g = torch::autograd::grad({out.value}, inputs, {up}, false, false, /*allow_unused=*/true);
  size_t k = 0;
  for (const auto& t : wrt) out.g.push_back(t.requires_grad() ? g[k++] : torch::Tensor());
  return out;
}

TEST(RecomputeTail, GradientsEqualTheFullResidualLinear) {
  std::vector<TailCase> cases(8);
  cases[1].bias = false;
  cases[2].frozen_weight = true;
  cases[3].h_grad = false;
  cases[4].m_grad = false;
  cases[5].lora = true;
  cases[5].frozen_weight = true;
  cases[6].lora = true;
  cases[6].bias = false;
  cases[7].dtype = torch::kBFloat16;
  const char* names[] = {"dh", "dm", "dW", "db", "dA", "dB"};
  for (const TailCase& c : cases) {
    const int64_t skipped = vlm::recompute_tails_skipped();
    const Grads full = run_tail(c, false);
    EXPECT_EQ(vlm::recompute_tails_skipped(), skipped) << c.tag();
    const Grads tail = run_tail(c, true);
    EXPECT_EQ(vlm::recompute_tails_skipped(), skipped + 1) << c.tag();
    ASSERT_EQ(full.g.size(), tail.g.size()) << c.tag();
    // fp32: same products summed in another order (1e-5 of the largest entry); bf16: the
    // reference rounds its GEMM output to bf16 before use, the tail does not compute it
    // (2^-7 relative).
    const double tol = c.dtype == torch::kFloat32 ? 1e-5 : 8e-3;
    for (size_t k = 0; k < full.g.size(); ++k) {
      ASSERT_EQ(full.g[k].defined(), tail.g[k].defined()) << c.tag() << " " << names[k];
      if (!full.g[k].defined()) continue;
      ASSERT_EQ(full.g[k].scalar_type(), tail.g[k].scalar_type()) << c.tag() << " " << names[k];
      const auto a = full.g[k].to(torch::kFloat64), b = tail.g[k].to(torch::kFloat64);
      const double scale = std::max(a.abs().max().item<double>(), 1e-12);
      EXPECT_GT(scale, 1e-6) << c.tag() << " " << names[k] << ": a zero gradient proves nothing";
      EXPECT_LE((a - b).abs().max().item<double>(), tol * scale) << c.tag() << " " << names[k];
    }
  }
}

TEST(RecomputeTail, ValueIsTheResidualOnlyInsideTheGuardOfThatBlock) {
  vlm::Linear lin(8, 6, true, torch::TensorOptions());
  vlm::materialize(*lin, {torch::kCPU, torch::kFloat32, 1});
  auto h = torch::randn({3, 6}).requires_grad_(true);
  auto m = torch::randn({3, 8}).requires_grad_(true);
  const auto full = (h + torch::linear(m, lin->weight, lin->bias)).detach();
  torch::nn::Module block, other;
  EXPECT_TRUE(torch::allclose(vlm::residual_linear(&block, h, m, *lin), full));
  {
    vlm::RecomputeTail guard(&block);
    EXPECT_TRUE(torch::equal(vlm::residual_linear(&block, h, m, *lin).detach(), h.detach()));
    // Another module (a nested block) computes the real output.
    EXPECT_TRUE(torch::allclose(vlm::residual_linear(&other, h, m, *lin), full));
    {
      vlm::RecomputeTail inner(&other);
      EXPECT_TRUE(torch::allclose(vlm::residual_linear(&block, h, m, *lin), full));
    }
    EXPECT_TRUE(torch::equal(vlm::residual_linear(&block, h, m, *lin).detach(), h.detach()));
    torch::NoGradGuard ng;  // no graph to build: the value is the real one
    EXPECT_TRUE(torch::allclose(vlm::residual_linear(&block, h, m, *lin), full));
  }
  EXPECT_TRUE(torch::allclose(vlm::residual_linear(&block, h, m, *lin), full));
}

}  // namespace
