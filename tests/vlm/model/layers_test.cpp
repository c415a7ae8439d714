// Leaf layers against independent references: torch::conv3d for the patch embedding
// (the spec's column layout c = ((ch*T + tt)*P + py)*P + px), the RMSNorm / QuickGELU /
// erf-GELU formulas written out in double precision, and meta -> real materialisation.
#include <gtest/gtest.h>

#include <cmath>

#include "vlm/model/layers.h"
#include "vlm/model/merger.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/mlp.h"

namespace {

TEST(Layers, PatchEmbedEqualsConv3d) {
  torch::manual_seed(0);
  vlm::PatchEmbed pe(16, 3, 2, 14, torch::TensorOptions());
  vlm::materialize(*pe, {torch::kCPU, torch::kFloat32, 1});
  auto pixels = torch::randn({5, 3 * 2 * 14 * 14});
  auto got = pe(pixels);
  // Reference: each row is a (C, T, P, P) volume; Conv3d with kernel = stride = its size.
  auto vol = pixels.view({5, 3, 2, 14, 14});
  auto want = torch::conv3d(vol, pe->proj->weight, {}, {2, 14, 14}).view({5, 16});
  EXPECT_TRUE(torch::allclose(got, want, 1e-4, 1e-5));
}

TEST(Layers, RmsNormFormulaAndDtype) {
  vlm::Norm n(vlm::NormKind::rms_norm, 8, 1e-6, torch::TensorOptions());
  vlm::materialize(*n, {torch::kCPU, torch::kFloat32, 1});
  {
    torch::NoGradGuard ng;
    n->weight.copy_(torch::linspace(0.5, 2.0, 8));
  }
  auto x = torch::randn({3, 8}, torch::kFloat64);
  auto got = n(x.to(torch::kFloat32)).to(torch::kFloat64);
  auto want = x / torch::sqrt(x.pow(2).mean(-1, true) + 1e-6) * n->weight.to(torch::kFloat64);
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6));
  // bf16 input: normalised in fp32, cast to bf16, then scaled (output stays bf16 x fp32 -> fp32
  // weight promotes; the cast point is what matters).
  auto xb = x.to(torch::kBFloat16);
  auto normed = (xb.to(torch::kFloat32) * torch::rsqrt(xb.to(torch::kFloat32).pow(2).mean(-1, true) + 1e-6))
                    .to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(n(xb), n->weight * normed));
}

TEST(Layers, LayerNormHasBiasAndMatchesFormula) {
  vlm::Norm n(vlm::NormKind::layer_norm, 6, 1e-6, torch::TensorOptions());
  vlm::materialize(*n, {torch::kCPU, torch::kFloat32, 1});
  EXPECT_TRUE(n->bias.defined());
  {
    torch::NoGradGuard ng;
    n->bias.fill_(0.25);
  }
  auto x = torch::randn({4, 6}, torch::kFloat64);
  auto mu = x.mean(-1, true);
  auto var = (x - mu).pow(2).mean(-1, true);
  auto want = (x - mu) / torch::sqrt(var + 1e-6) + 0.25;
  auto got = n(x.to(torch::kFloat32)).to(torch::kFloat64);
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << got << want;
}

TEST(Layers, QuickGeluMlpFormula) {
  vlm::Mlp m(vlm::MlpKind::quick_gelu, 4, 6, true, torch::TensorOptions());
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 2});
  auto x = torch::randn({3, 4});
  auto h = torch::matmul(x, m->fc1->weight.t()) + m->fc1->bias;
  auto want = torch::matmul(h / (1 + torch::exp(-1.702 * h)), m->fc2->weight.t()) + m->fc2->bias;
  EXPECT_TRUE(torch::allclose(m(x), want, 1e-5, 1e-6));
}

TEST(Layers, MergerConcatenatesFourConsecutiveTokensWithErfGelu) {
  auto cfg = vlm::preset("tiny");
  vlm::PatchMerger mg(cfg, torch::TensorOptions());
  vlm::materialize(*mg, {torch::kCPU, torch::kFloat32, 3});
  auto x = torch::randn({8, 128});
  auto got = mg(x);  // [2, 256]
  ASSERT_EQ(got.sizes(), torch::IntArrayRef({2, 256}));
  auto normed = torch::layer_norm(x, {128}, mg->ln_q->weight, mg->ln_q->bias, 1e-6);
  for (int64_t g = 0; g < 2; ++g) {
    auto cat = normed.narrow(0, 4 * g, 4).reshape({512});
    auto h = torch::matmul(mg->mlp->fc0->weight, cat) + mg->mlp->fc0->bias;
    h = 0.5 * h * (1 + torch::erf(h / std::sqrt(2.0)));
    auto want = torch::matmul(mg->mlp->fc2->weight, h) + mg->mlp->fc2->bias;
    EXPECT_TRUE(torch::allclose(got[g], want, 1e-4, 1e-5));
  }
}

TEST(Layers, MetaBuildTakesNoMemoryAndMaterialisesOnRequest) {
  // 151936 x 3584 fp32 would be 2.2 GB; on meta it is free.
  vlm::Embedding e(151936, 3584, torch::TensorOptions().device(torch::kMeta));
  EXPECT_TRUE(e->weight.is_meta());
  EXPECT_EQ(vlm::count_parameters(*e), 151936LL * 3584LL);
  vlm::Linear l(3, 2, true, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*l, {torch::kCPU, torch::kFloat64, 5});
  EXPECT_EQ(l->weight.scalar_type(), torch::kFloat64);
  EXPECT_FALSE(l->weight.is_meta());
  EXPECT_TRUE(l->named_parameters()["weight"].is_same(l->weight));
  EXPECT_TRUE(torch::all(l->bias == 0).item<bool>());
}

}  // namespace
