// vlm/model/lora.h against formulas written out here: the scaling (alpha / r, alpha / sqrt(r)),
// the forward y = x W^T + b + scaling * x A^T B^T in float64, PEFT's initialisations
// (kaiming-uniform(a = sqrt(5)) bound 1/sqrt(in); gaussian std 1/r), merging, parameter and
// PEFT tensor names, and dropout (identity in eval mode).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "vlm/runtime/check.h"
#include "vlm/model/layers.h"
#include "vlm/model/lora.h"
#include "vlm/model/meta_init.h"

namespace {

// A real fp32 Linear with random weight and bias.
vlm::Linear lut_linear(int64_t in, int64_t out, uint64_t seed = 1) {
  vlm::Linear l(in, out, /*bias=*/true, torch::TensorOptions());
  vlm::materialize(*l, {torch::kCPU, torch::kFloat32, seed});
  torch::NoGradGuard ng;
  l->bias.normal_(0, 0.1);
  return l;
}

// x W^T + b + s x A^T B^T, in float64.
torch::Tensor lut_formula(const vlm::LinearImpl& l, const torch::Tensor& x, double s) {
  auto d = [](const torch::Tensor& t) { return t.detach().to(torch::kFloat64); };
  auto y = torch::matmul(d(x), d(l.weight).t()) + d(l.bias);
  return y + s * torch::matmul(torch::matmul(d(x), d(l.lora_A->weight).t()), d(l.lora_B->weight).t());
}

void lut_randomize_b(vlm::LinearImpl& l, uint64_t seed) {
  torch::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  l.lora_B->weight.copy_(torch::randn(l.lora_B->weight.sizes(), gen) * 0.1);
}

TEST(Lora, ScalingIsAlphaOverROrOverSqrtR) {
  for (int64_t r : {1, 4, 8, 16, 64}) {
    for (double alpha : {1.0, 8.0, 16.0, 32.5}) {
      vlm::LoraOptions o;
      o.r = r;
      o.alpha = alpha;
      EXPECT_DOUBLE_EQ(o.scaling(), alpha / static_cast<double>(r)) << "r " << r << " alpha " << alpha;
      o.rslora = true;
      EXPECT_DOUBLE_EQ(o.scaling(), alpha / std::sqrt(static_cast<double>(r))) << "r " << r << " alpha " << alpha;
    }
  }
}

TEST(Lora, ForwardAddsScaledLowRankProduct) {
  for (bool rslora : {false, true}) {
    auto l = lut_linear(24, 20);
    vlm::LoraOptions o;
    o.r = 4;
    o.alpha = 6;
    o.rslora = rslora;
    vlm::add_lora(*l, o, 7, "layer");
    lut_randomize_b(*l, 3);
    EXPECT_DOUBLE_EQ(l->lora_scaling, rslora ? 3.0 : 1.5);
    auto x = torch::randn({5, 24});
    // fp32 against float64: |y| ~ 1, rounding ~1e-6.
    EXPECT_TRUE(torch::allclose(l(x).to(torch::kFloat64), lut_formula(*l, x, rslora ? 3.0 : 1.5), 1e-5, 1e-5))
        << "rslora " << rslora;
  }
}

TEST(Lora, FreshAdapterLeavesTheForwardUnchanged) {
  for (auto init : {vlm::LoraInit::kaiming, vlm::LoraInit::gaussian}) {
    auto l = lut_linear(32, 16);
    auto x = torch::randn({3, 7, 32});
    const auto before = l(x);
    vlm::LoraOptions o;
    o.init = init;
    vlm::add_lora(*l, o, 11, "q");
    EXPECT_TRUE(torch::equal(l->lora_B->weight, torch::zeros({16, o.r})));
    EXPECT_GT(l->lora_A->weight.abs().max().item<double>(), 0.0);
    EXPECT_TRUE(torch::equal(l(x), before)) << vlm::lora_init_name(init);
  }
}

// A: kaiming_uniform_(a = sqrt(5)) has bound gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + 5)),
// i.e. 1/sqrt(in): every value inside, the extremes near it, the std bound / sqrt(3).
// in = 256, r = 64: 16384 draws; the sample std of a uniform has relative standard error
// sqrt(0.8 / n) / 2 = 0.35%, so 4% is > 10 sigma; the max of n uniforms falls short of the bound by
// ~ bound * 2/n.
TEST(Lora, KaimingInitIsUniformWithinOneOverSqrtIn) {
  const int64_t in = 256, r = 64;
  auto l = lut_linear(in, 32);
  vlm::LoraOptions o;
  o.r = r;
  vlm::add_lora(*l, o, 5, "model.layers.0.self_attn.q_proj");
  const auto a = l->lora_A->weight.detach().to(torch::kFloat64);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  EXPECT_LE(a.abs().max().item<double>(), bound);
  EXPECT_GE(a.abs().max().item<double>(), bound * 0.999);
  EXPECT_NEAR(a.std().item<double>(), bound / std::sqrt(3.0), 0.04 * bound / std::sqrt(3.0));
  EXPECT_NEAR(a.mean().item<double>(), 0.0, 5 * bound / std::sqrt(3.0 * a.numel()));
}

// A ~ N(0, std = 1/r) (PEFT: nn.init.normal_(A, std=1 / r)). r = 16, in = 1024: 16384 draws;
// the relative standard error of the sample std is 1/sqrt(2n) = 0.55%, so 3% is > 5 sigma.
TEST(Lora, GaussianInitHasStdOneOverR) {
  const int64_t in = 1024, r = 16;
  auto l = lut_linear(in, 8);
  vlm::LoraOptions o;
  o.r = r;
  o.init = vlm::LoraInit::gaussian;
  vlm::add_lora(*l, o, 5, "g");
  const auto a = l->lora_A->weight.detach().to(torch::kFloat64);
  EXPECT_NEAR(a.std().item<double>(), 1.0 / r, 0.03 / r);
  EXPECT_NEAR(a.mean().item<double>(), 0.0, 5.0 / r / std::sqrt(static_cast<double>(a.numel())));
}

TEST(Lora, InitIsDeterministicPerSeedAndName) {
  auto draw = [](uint64_t seed, const std::string& name) {
    auto l = lut_linear(16, 16);
    vlm::add_lora(*l, vlm::LoraOptions{}, seed, name);
    return l->lora_A->weight.detach().clone();
  };
  EXPECT_TRUE(torch::equal(draw(1, "a.q_proj"), draw(1, "a.q_proj")));
  EXPECT_FALSE(torch::equal(draw(1, "a.q_proj"), draw(2, "a.q_proj")));
  EXPECT_FALSE(torch::equal(draw(1, "a.q_proj"), draw(1, "a.k_proj")));
}

TEST(Lora, ParameterNamesOptionsAndMetaDevice) {
  auto l = lut_linear(12, 10);
  vlm::LoraOptions o;
  o.r = 3;
  o.alpha = 5;
  o.rslora = true;
  o.dropout = 0.25;
  o.init = vlm::LoraInit::gaussian;
  vlm::add_lora(*l, o, 0, "m");
  std::vector<std::string> names;
  for (const auto& p : l->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias", "lora_A.weight", "lora_B.weight"}));
  EXPECT_EQ(l->lora_A->weight.sizes(), (std::vector<int64_t>{3, 12}));
  EXPECT_EQ(l->lora_B->weight.sizes(), (std::vector<int64_t>{10, 3}));
  EXPECT_EQ(l->lora_options.r, 3);
  EXPECT_EQ(l->lora_options.alpha, 5);
  EXPECT_TRUE(l->lora_options.rslora);
  EXPECT_EQ(l->lora_options.dropout, 0.25);
  EXPECT_EQ(l->lora_options.init, vlm::LoraInit::gaussian);
  EXPECT_DOUBLE_EQ(l->lora_scaling, 5 / std::sqrt(3.0));
  EXPECT_THROW(vlm::add_lora(*l, o, 0, "m"), vlm::Error);  // already has one

  vlm::Linear meta(12, 10, false, torch::TensorOptions().device(torch::kMeta));
  vlm::add_lora(*meta, o, 0, "meta");
  EXPECT_TRUE(meta->lora_A->weight.is_meta());
  EXPECT_TRUE(meta->lora_B->weight.is_meta());

  for (auto bad : {vlm::LoraOptions{0, 8, 0, false, vlm::LoraInit::kaiming},
                   vlm::LoraOptions{4, 0, 0, false, vlm::LoraInit::kaiming},
                   vlm::LoraOptions{4, 8, 1.0, false, vlm::LoraInit::kaiming}}) {
    vlm::Linear fresh(4, 4, false, torch::TensorOptions());
    EXPECT_THROW(vlm::add_lora(*fresh, bad, 0, "bad"), vlm::Error);
  }
}

TEST(Lora, MergeAddsScaledProductAndRemovesAdapters) {
  auto l = lut_linear(16, 12);
  vlm::LoraOptions o;
  o.r = 2;
  o.alpha = 3;
  vlm::add_lora(*l, o, 9, "x");
  lut_randomize_b(*l, 4);
  const auto w = l->weight.detach().to(torch::kFloat64).clone();
  const auto delta = 1.5 * torch::matmul(l->lora_B->weight.detach().to(torch::kFloat64),
                                         l->lora_A->weight.detach().to(torch::kFloat64));
  auto x = torch::randn({4, 16});
  const auto before = l(x);
  vlm::merge_lora(*l);
  EXPECT_FALSE(vlm::has_lora(*l));
  EXPECT_EQ(l->named_parameters().size(), 2u);
  EXPECT_TRUE(torch::allclose(l->weight.to(torch::kFloat64), w + delta, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(l(x), before, 1e-5, 1e-5));
  EXPECT_EQ(l->lora_scaling, 0);
  EXPECT_EQ(l->lora_options.r, vlm::LoraOptions{}.r);
}

TEST(Lora, ModuleListingAndMergeAll) {
  struct Two : torch::nn::Module {
    vlm::Linear a{nullptr}, b{nullptr};
    Two() {
      a = register_module("a", lut_linear(8, 8, 1));
      b = register_module("b", lut_linear(8, 8, 2));
    }
  };
  auto m = std::make_shared<Two>();
  vlm::add_lora(*m->b, vlm::LoraOptions{}, 0, "b");
  std::vector<std::string> all, adapted;
  for (auto& [p, _] : vlm::linear_modules(*m)) all.push_back(p);
  for (auto& [p, _] : vlm::lora_modules(*m)) adapted.push_back(p);
  EXPECT_EQ(all, (std::vector<std::string>{"a", "b"}));  // lora_A / lora_B are not listed
  EXPECT_EQ(adapted, (std::vector<std::string>{"b"}));
  EXPECT_EQ(vlm::merge_all_lora(*m), 1);
  EXPECT_TRUE(vlm::lora_modules(*m).empty());
}

TEST(Lora, PeftTensorNames) {
  EXPECT_TRUE(vlm::is_lora_param("model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_FALSE(vlm::is_lora_param("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(vlm::peft_tensor_name("model.layers.0.self_attn.q_proj.lora_A.weight"),
            "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(vlm::peft_tensor_name("visual.blocks.3.attn.qkv.lora_B.weight"),
            "base_model.model.model.visual.blocks.3.attn.qkv.lora_B.weight");
  EXPECT_EQ(vlm::peft_tensor_name("lm_head.lora_A.weight"), "base_model.model.lm_head.lora_A.weight");
  EXPECT_THROW(vlm::peft_tensor_name("model.layers.0.self_attn.q_proj.weight"), vlm::Error);

  const std::string q = "model.layers.0.self_attn.q_proj.lora_A.weight";
  // nested (transformers 5), legacy (transformers 4), with the adapter name (live PeftModel)
  EXPECT_EQ(vlm::canonical_from_peft("base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"), q);
  EXPECT_EQ(vlm::canonical_from_peft("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), q);
  EXPECT_EQ(vlm::canonical_from_peft("base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.default.weight"), q);
  EXPECT_EQ(vlm::canonical_from_peft("base_model.model.model.visual.blocks.1.attn.qkv.lora_B.weight"),
            "visual.blocks.1.attn.qkv.lora_B.weight");
  EXPECT_EQ(vlm::canonical_from_peft("base_model.model.visual.blocks.1.attn.qkv.lora_B.other.weight"),
            "visual.blocks.1.attn.qkv.lora_B.weight");
  for (const char* bad : {"model.layers.0.self_attn.q_proj.lora_A.weight",  // no base_model.model.
                          "base_model.model.model.layers.0.self_attn.q_proj.weight",
                          "base_model.model.model.embed_tokens.lora_embedding_A.weight",
                          "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector.weight"}) {
    EXPECT_THROW(vlm::canonical_from_peft(bad), vlm::Error) << bad;
  }
  // Round trip.
  for (const std::string& c : {q, std::string("visual.merger.mlp.0.lora_B.weight")})
    EXPECT_EQ(vlm::canonical_from_peft(vlm::peft_tensor_name(c)), c);
}

TEST(Lora, DropoutIsIdentityInEvalModeOnly) {
  auto l = lut_linear(64, 32);
  vlm::LoraOptions o;
  o.dropout = 0.5;
  vlm::add_lora(*l, o, 1, "d");
  lut_randomize_b(*l, 2);
  auto x = torch::randn({8, 64});
  l->eval();
  EXPECT_TRUE(torch::allclose(l(x).to(torch::kFloat64), lut_formula(*l, x, o.scaling()), 1e-5, 1e-5));
  l->train();
  torch::manual_seed(0);
  const auto t1 = l(x);
  // Training mode: the adapter sees a dropped-out input, so the output differs from eval's
  // (with p = 0.5 over 512 inputs, equality would need every draw to keep every element).
  EXPECT_FALSE(torch::allclose(t1.to(torch::kFloat64), lut_formula(*l, x, o.scaling()), 1e-5, 1e-5));
  // The base path is untouched: with B = 0 training mode changes nothing.
  torch::NoGradGuard ng;
  l->lora_B->weight.zero_();
  EXPECT_TRUE(torch::equal(l(x), torch::linear(x, l->weight, l->bias)));
}

}  // namespace
