// The composed model on the tiny presets of both families, fp32 on CPU.
// References: a dense masked attention written out here (for the packed varlen path),
// per-image runs (for packing), unpadded runs (for padding), a log-softmax loss computed
// here from the logits (for the supervised-only head), overfitting one batch, and the
// gradient of every parameter.
#include <gtest/gtest.h>

#include <cmath>

#include "vlm/model/attention.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/model/rope_index.h"

namespace {

using vlm::Batch;
using vlm::VlmConfig;

vlm::VisionLanguageModel make_test_model(const std::string& preset, uint64_t seed = 0) {
  vlm::VisionLanguageModel m(vlm::preset(preset), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, seed});
  return m;
}

// One sequence: text prefix, <vs>, n image tokens, <ve>, answer (supervised).
struct Seq {
  std::vector<int64_t> ids, labels;
};
Seq make_seq(const VlmConfig& c, const std::vector<int64_t>& prefix, int64_t n_img,
             const std::vector<int64_t>& answer) {
  Seq s;
  s.ids = prefix;
  if (n_img > 0) {
    s.ids.push_back(c.vision_start_token_id);
    for (int64_t i = 0; i < n_img; ++i) s.ids.push_back(c.image_token_id);
    s.ids.push_back(c.vision_end_token_id);
  }
  s.labels.assign(s.ids.size(), -100);
  for (int64_t a : answer) {
    s.ids.push_back(a);
    s.labels.push_back(a);
  }
  return s;
}

// Left-pads sequences into a Batch.
Batch pack(const std::vector<Seq>& seqs, int64_t pad_id = 0) {
  size_t l = 0;
  for (const auto& s : seqs) l = std::max(l, s.ids.size());
  const int64_t b = static_cast<int64_t>(seqs.size()), L = static_cast<int64_t>(l);
  Batch batch;
  batch.input_ids = torch::full({b, L}, pad_id, torch::kInt64);
  batch.labels = torch::full({b, L}, -100, torch::kInt64);
  batch.attention_mask = torch::zeros({b, L}, torch::kInt64);
  for (int64_t i = 0; i < b; ++i) {
    const auto& s = seqs[i];
    const int64_t off = L - static_cast<int64_t>(s.ids.size());
    for (size_t j = 0; j < s.ids.size(); ++j) {
      batch.input_ids[i][off + j] = s.ids[j];
      batch.labels[i][off + j] = s.labels[j];
      batch.attention_mask[i][off + j] = 1;
    }
  }
  return batch;
}

// Two images: grid (1,4,4) -> 4 tokens, grid (1,4,8) -> 8 tokens.
Batch image_batch(const VlmConfig& c) {
  auto s0 = make_seq(c, {5, 6, 7}, 4, {100, 101, 102, 103, 104, 105});
  auto s1 = make_seq(c, {8, 9}, 8, {200, 201, 202, 203, 204, 205, 206, 207, 208});
  Batch b = pack({s0, s1});
  torch::manual_seed(123);
  b.pixel_values = torch::randn({16 + 32, c.vision.patch_dim()});
  b.image_grid_thw = torch::tensor({1, 4, 4, 1, 4, 8}, torch::kInt64).view({2, 3});
  return b;
}

// ---------------------------------------------------------------- attention

TEST(Attention, VarlenEqualsDenseBlockDiagonal) {
  torch::manual_seed(0);
  const int64_t s = 4 + 4 + 6 + 3, h = 2, d = 8;
  std::vector<int64_t> cu{0, 4, 8, 14, 17};
  auto q = torch::randn({s, h, d}), k = torch::randn({s, h, d}), v = torch::randn({s, h, d});
  auto got = vlm::varlen_attention(q, k, v, cu, 0.3);
  // Reference: explicit softmax per head with a block-diagonal mask.
  auto seg = torch::zeros({s}, torch::kInt64);
  for (size_t i = 0; i + 1 < cu.size(); ++i) seg.narrow(0, cu[i], cu[i + 1] - cu[i]).fill_(static_cast<int64_t>(i));
  auto allowed = seg.unsqueeze(0) == seg.unsqueeze(1);  // [S, S]
  for (int64_t hh = 0; hh < h; ++hh) {
    auto sc = torch::matmul(q.select(1, hh), k.select(1, hh).t()) * 0.3;
    sc = sc.masked_fill(allowed.logical_not(), -1e30);
    auto want = torch::matmul(torch::softmax(sc, -1), v.select(1, hh));
    EXPECT_TRUE(torch::allclose(got.select(1, hh), want, 1e-5, 1e-6));
  }
}

TEST(Attention, GqaUsesKvHeadOfItsGroup) {
  torch::manual_seed(1);
  auto q = torch::randn({2, 4, 5, 8}), k = torch::randn({2, 2, 5, 8}), v = torch::randn({2, 2, 5, 8});
  auto mask = torch::rand({2, 1, 5, 5}) > 0.3;
  mask = mask.logical_or(torch::eye(5, torch::kBool).view({1, 1, 5, 5}));
  auto got = vlm::attention(q, k, v, mask, 0.5);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < 4; ++j) {
      auto sc = torch::matmul(q[b][j], k[b][j / 2].t()) * 0.5;
      sc = sc.masked_fill(mask[b][0].logical_not(), -1e30);
      auto want = torch::matmul(torch::softmax(sc, -1), v[b][j / 2]);
      EXPECT_TRUE(torch::allclose(got[b][j], want, 1e-5, 1e-6));
    }
}

// ---------------------------------------------------------------- model, both families

class Tiny : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Families, Tiny, ::testing::Values("tiny", "tiny-qwen2.5", "tiny-qwen3", "tiny-qwen3.5"));

TEST_P(Tiny, PackedImagesEqualSeparateRuns) {
  auto m = make_test_model(GetParam());
  torch::NoGradGuard ng;
  auto b = image_batch(m->cfg);
  auto both = m->image_features(b.pixel_values, b.image_grid_thw);
  auto a = m->image_features(b.pixel_values.narrow(0, 0, 16), b.image_grid_thw.narrow(0, 0, 1));
  auto c = m->image_features(b.pixel_values.narrow(0, 16, 32), b.image_grid_thw.narrow(0, 1, 1));
  ASSERT_EQ(both.features.sizes(), torch::IntArrayRef({12, 256}));
  EXPECT_TRUE(torch::allclose(both.features, torch::cat({a.features, c.features}), 1e-5, 1e-5));
  // DeepStack features (Qwen3-VL) pack the same way; none for the Qwen2 families.
  ASSERT_EQ(both.deepstack.size(), m->cfg.vision.deepstack_visual_indexes.size());
  for (size_t k = 0; k < both.deepstack.size(); ++k)
    EXPECT_TRUE(torch::allclose(both.deepstack[k], torch::cat({a.deepstack[k], c.deepstack[k]}), 1e-5, 1e-5)) << k;
}

TEST_P(Tiny, PaddingDoesNotChangeLogits) {
  auto m = make_test_model(GetParam());
  torch::NoGradGuard ng;
  auto b = image_batch(m->cfg);  // sequence 0 is left-padded
  auto out = m->forward(b, true);
  // Sequence 0 alone, unpadded.
  const int64_t L = b.input_ids.size(1);
  const int64_t n = b.attention_mask[0].sum().item<int64_t>();
  Batch one;
  one.input_ids = b.input_ids.narrow(0, 0, 1).narrow(1, L - n, n);
  one.pixel_values = b.pixel_values.narrow(0, 0, 16);
  one.image_grid_thw = b.image_grid_thw.narrow(0, 0, 1);
  auto ref = m->forward(one, true);
  EXPECT_TRUE(torch::allclose(out.logits[0].narrow(0, L - n, n), ref.logits[0], 1e-4, 1e-5))
      << (out.logits[0].narrow(0, L - n, n) - ref.logits[0]).abs().max().item<double>();
}

TEST_P(Tiny, SupervisedOnlyHeadGivesTheFullLoss) {
  auto m = make_test_model(GetParam());
  torch::NoGradGuard ng;
  auto b = image_batch(m->cfg);
  auto fast = m->forward(b, false);
  auto full = m->forward(b, true);
  // Reference from the logits: -log_softmax at the next token, summed over labels != -100.
  auto lp = torch::log_softmax(full.logits, -1);
  double sum = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < b.input_ids.size(0); ++i)
    for (int64_t t = 0; t + 1 < b.input_ids.size(1); ++t) {
      const int64_t y = b.labels[i][t + 1].item<int64_t>();
      if (y == -100) continue;
      sum -= lp[i][t][y].item<double>();
      ++n;
    }
  EXPECT_EQ(n, 6 + 9);
  EXPECT_EQ(fast.n_tokens, n);
  EXPECT_EQ(full.n_tokens, n);
  EXPECT_NEAR(fast.loss_sum.item<double>(), sum, 1e-3);
  EXPECT_NEAR(full.loss_sum.item<double>(), sum, 1e-3);
  // A random model is near uniform: mean loss ~ log(vocab).
  EXPECT_NEAR(sum / n, std::log(2048.0), 0.5);
}

TEST_P(Tiny, GradientsReachEveryParameter) {
  auto m = make_test_model(GetParam());
  auto b = image_batch(m->cfg);
  auto out = m->forward(b);
  (out.loss_sum / out.n_tokens).backward();
  for (const auto& p : m->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
  }
}

TEST_P(Tiny, TextOnlyBatchStillRunsTheVisionTower) {
  auto m = make_test_model(GetParam());
  auto b = pack({make_seq(m->cfg, {5, 6, 7}, 0, {10, 11, 12})});
  auto out = m->forward(b);
  out.loss_sum.backward();
  // The dummy image enters the loss times 0: vision grads exist and are exactly zero.
  for (const auto& p : m->visual->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_EQ(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
  }
  EXPECT_GT(m->model->embed_tokens->weight.grad().abs().sum().item<double>(), 0.0);
}

struct Recorder : vlm::UnitRunner {
  std::vector<std::string> paths;
  torch::Tensor run(const std::string& path, torch::nn::Module& unit, const torch::Tensor& x,
                    const std::function<torch::Tensor(const torch::Tensor&)>& fn) override {
    paths.push_back(path);
    return fn(x);
  }
};

TEST_P(Tiny, UnitsRunThroughTheRunnerInTableOrder) {
  auto m = make_test_model(GetParam());
  auto rec = std::make_shared<Recorder>();
  m->set_runner(rec);
  m->forward(image_batch(m->cfg));
  std::vector<std::string> want;
  for (const auto& u : m->units()) want.push_back(u.path);
  EXPECT_EQ(rec->paths, want);
  // Every parameter belongs to exactly one unit.
  int64_t total = 0;
  for (const auto& u : m->units())
    if (u.shares_params_with.empty()) total += vlm::count_parameters(*u.module);
  EXPECT_EQ(total, vlm::count_parameters(*m));
}

// Keeps every unit's fn, input and output, like an activation-checkpointing runner that
// recomputes units during backward (after forward has returned).
struct Keeper : vlm::UnitRunner {
  std::vector<std::function<torch::Tensor(const torch::Tensor&)>> fns;
  std::vector<torch::Tensor> xs, ys;
  torch::Tensor run(const std::string& path, torch::nn::Module& unit, const torch::Tensor& x,
                    const std::function<torch::Tensor(const torch::Tensor&)>& fn) override {
    fns.push_back(fn);
    xs.push_back(x);
    ys.push_back(fn(x));
    return ys.back();
  }
};

TEST_P(Tiny, UnitFunctionsCanBeReplayedAfterForward) {
  auto m = make_test_model(GetParam());
  auto keep = std::make_shared<Keeper>();
  m->set_runner(keep);
  torch::NoGradGuard ng;
  m->forward(image_batch(m->cfg));
  ASSERT_EQ(keep->fns.size(), m->units().size());
  for (size_t i = 0; i < keep->fns.size(); ++i)
    EXPECT_TRUE(torch::equal(keep->fns[i](keep->xs[i]), keep->ys[i])) << m->units()[i].path;
}

TEST_P(Tiny, ImageTokenCountMismatchIsAnError) {
  auto m = make_test_model(GetParam());
  auto b = image_batch(m->cfg);
  b.input_ids[1][3] = 9;  // one image token fewer than features
  b.position_ids = torch::zeros({3, 2, b.input_ids.size(1)}, torch::kInt64);
  try {
    m->forward(b);
    FAIL() << "no error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("image tokens"), std::string::npos) << e.what();
  }
}

TEST_P(Tiny, Bf16ForwardBackwardTracksFp32) {
  // Same seed, same init (drawn in fp32 then cast): the bf16 loss stays near the fp32 one,
  // and every dtype hand-off (pixels, rotary, norms, softmax, splice, head) accepts bf16.
  auto m32 = make_test_model(GetParam(), 4);
  vlm::VisionLanguageModel m16(vlm::preset(GetParam()), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m16, {torch::kCPU, torch::kBFloat16, 4});
  auto b = image_batch(m32->cfg);
  auto ref = m32->forward(b);
  auto out = m16->forward(b);
  EXPECT_EQ(out.loss_sum.scalar_type(), torch::kFloat32);
  const double a = ref.loss_sum.item<double>() / ref.n_tokens, c = out.loss_sum.item<double>() / out.n_tokens;
  EXPECT_NEAR(c, a, 0.02 * a);
  out.loss_sum.backward();
  for (const auto& p : m16->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_EQ(p.value().grad().scalar_type(), torch::kBFloat16) << p.key();
  }
}

TEST_P(Tiny, OverfitsOneBatch) {
  auto m = make_test_model(GetParam(), 1);
  auto b = image_batch(m->cfg);
  torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(2e-3));
  double first = 0, loss = 0;
  int step = 0;
  for (; step < 300; ++step) {
    opt.zero_grad();
    auto out = m->forward(b);
    auto mean = out.loss_sum / out.n_tokens;
    mean.backward();
    opt.step();
    loss = mean.item<double>();
    if (step == 0) first = loss;
    if (loss < 0.05) break;
  }
  std::cout << GetParam() << ": loss " << first << " -> " << loss << " in " << step + 1 << " steps\n";
  EXPECT_GT(first, 5.0);
  EXPECT_LT(loss, 0.05);
}

}  // namespace

namespace {
// The same sequences right-padded (what collate builds for training).
Batch right_padded(const Batch& left) {
  const int64_t b = left.input_ids.size(0), L = left.input_ids.size(1);
  Batch r = left;
  r.input_ids = torch::zeros_like(left.input_ids);
  r.labels = torch::full_like(left.labels, -100);
  r.attention_mask = torch::zeros_like(left.attention_mask);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t n = left.attention_mask[i].sum().item<int64_t>();
    r.input_ids[i].narrow(0, 0, n).copy_(left.input_ids[i].narrow(0, L - n, n));
    r.labels[i].narrow(0, 0, n).copy_(left.labels[i].narrow(0, L - n, n));
    r.attention_mask[i].narrow(0, 0, n).fill_(1);
  }
  return r;
}

std::vector<torch::Tensor> loss_and_grads(vlm::VisionLanguageModelImpl& m, const Batch& b) {
  m.zero_grad();
  auto out = m.forward(b);
  out.loss_sum.backward();
  std::vector<torch::Tensor> r{out.loss_sum.detach().reshape({1})};
  for (const auto& p : m.parameters()) r.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return r;
}
}  // namespace

// Training batches are right-padded: the LLM then attends causally without a mask tensor
// (flash attention on CUDA), and the loss rows come precomputed from the host. Reference:
// the same batch through the masked path with rows derived from the labels.
TEST_P(Tiny, RightPaddedCausalPathEqualsMaskedPath) {
  auto m = make_test_model(GetParam(), 4);
  Batch b = right_padded(image_batch(m->cfg));
  ASSERT_EQ(b.attention_mask[0][-1].item<int64_t>(), 0) << "row 0 must have padding at its end";
  b.position_ids = vlm::get_rope_index(b.input_ids, b.image_grid_thw, b.attention_mask, m->cfg).position_ids;
  const auto ref = loss_and_grads(*m, b);
  Batch fast = b;
  fast.right_padded = true;
  fast.loss_rows = vlm::supervised_rows(b.labels);
  EXPECT_EQ(fast.loss_rows.size(0), (b.labels.narrow(1, 1, b.labels.size(1) - 1) != -100).sum().item<int64_t>());
  const auto got = loss_and_grads(*m, fast);
  ASSERT_EQ(got.size(), ref.size());
  EXPECT_GT(ref[0].item<float>(), 0.0f);
  for (size_t i = 0; i < ref.size(); ++i) {
    const double scale = std::max(1e-12, ref[i].abs().max().item<double>());
    EXPECT_LE((got[i] - ref[i]).abs().max().item<double>() / scale, 1e-5) << (i == 0 ? "loss" : "a gradient");
  }
}
