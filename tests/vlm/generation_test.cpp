// Generation with the KV cache against full recomputation of the whole sequence at every
// step (same tokens, logits within 1e-5), batched with left padding and images, for both
// families; stop tokens; sampling determinism.
#include <gtest/gtest.h>

#include "vlm/config.h"
#include "vlm/generation.h"
#include "vlm/meta_init.h"
#include "vlm/qwen2_vl.h"

namespace {

vlm::Qwen2VL make_gen_model(const std::string& preset) {
  vlm::Qwen2VL m(vlm::preset(preset), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 3});
  return m;
}

// Two prompts, left-padded: [3 text, vs, 4 image, ve, 2 text] and [1 text, vs, 8 image, ve, 1 text].
vlm::Batch prompts(const vlm::VlmConfig& c) {
  std::vector<std::vector<int64_t>> seqs{{5, 6, 7, c.vision_start_token_id}, {8, c.vision_start_token_id}};
  for (int i = 0; i < 4; ++i) seqs[0].push_back(c.image_token_id);
  for (int i = 0; i < 8; ++i) seqs[1].push_back(c.image_token_id);
  seqs[0].insert(seqs[0].end(), {c.vision_end_token_id, 11, 12});
  seqs[1].insert(seqs[1].end(), {c.vision_end_token_id, 13});
  const int64_t L = std::max(seqs[0].size(), seqs[1].size());
  vlm::Batch b;
  b.input_ids = torch::zeros({2, L}, torch::kInt64);
  b.attention_mask = torch::zeros({2, L}, torch::kInt64);
  for (int i = 0; i < 2; ++i) {
    const int64_t off = L - static_cast<int64_t>(seqs[i].size());
    for (size_t j = 0; j < seqs[i].size(); ++j) {
      b.input_ids[i][off + j] = seqs[i][j];
      b.attention_mask[i][off + j] = 1;
    }
  }
  torch::manual_seed(7);
  b.pixel_values = torch::randn({16 + 32, c.vision.patch_dim()});
  b.image_grid_thw = torch::tensor({1, 4, 4, 1, 4, 8}, torch::kInt64).view({2, 3});
  return b;
}

// Records the query length every call of model.layers.0 sees.
struct LenRecorder : vlm::UnitRunner {
  std::vector<int64_t> lens;
  torch::Tensor run(const std::string& path, torch::nn::Module& unit, const torch::Tensor& x,
                    const std::function<torch::Tensor(const torch::Tensor&)>& fn) override {
    if (path == "model.layers.0") lens.push_back(x.size(1));
    return fn(x);
  }
};

class Gen : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Families, Gen, ::testing::Values("tiny", "tiny-qwen2.5"));

TEST_P(Gen, KvCacheMatchesFullRecomputation) {
  auto m = make_gen_model(GetParam());
  auto b = prompts(m->cfg);
  vlm::GenerationOptions o;
  o.max_new_tokens = 12;
  o.keep_logits = true;
  o.run_to_max = true;
  auto rec = std::make_shared<LenRecorder>();
  m->set_runner(rec);
  auto cached = vlm::generate(*m, b, o);
  // The cached run really decodes one token per step after the prompt.
  const int64_t L = b.input_ids.size(1);
  std::vector<int64_t> want_cached(12, 1), want_full;
  want_cached[0] = L;
  for (int64_t i = 0; i < 12; ++i) want_full.push_back(L + i);
  EXPECT_EQ(rec->lens, want_cached);
  rec->lens.clear();
  o.use_cache = false;
  auto full = vlm::generate(*m, b, o);
  EXPECT_EQ(rec->lens, want_full);
  ASSERT_EQ(cached.tokens.size(), 2u);
  EXPECT_EQ(cached.tokens, full.tokens);
  EXPECT_EQ(cached.tokens[0].size(), 12u);
  ASSERT_EQ(cached.logits.sizes(), full.logits.sizes());
  const double diff = (cached.logits - full.logits).abs().max().item<double>();
  EXPECT_LT(diff, 1e-5);
  std::cout << GetParam() << ": max |logit diff| cache vs full = " << diff << "\n";
}

TEST_P(Gen, GreedyFirstTokenIsArgmaxOfTheTrainingForward) {
  auto m = make_gen_model(GetParam());
  auto b = prompts(m->cfg);
  vlm::GenerationOptions o;
  o.max_new_tokens = 1;
  auto g = vlm::generate(*m, b, o);
  torch::NoGradGuard ng;
  auto out = m->forward(b, true);
  const int64_t L = b.input_ids.size(1);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(g.tokens[i][0], out.logits[i][L - 1].argmax().item<int64_t>());
}

TEST(Generation, StopsOnStopTokenAndPadsAfter) {
  auto m = make_gen_model("tiny");
  auto b = prompts(m->cfg);
  vlm::GenerationOptions o;
  o.max_new_tokens = 10;
  auto free_run = vlm::generate(*m, b, o);
  // Make sequence 0's third token a stop token: it must end there, sequence 1 continues.
  const int64_t stop = free_run.tokens[0][2];
  o.stop_tokens = {stop};
  auto g = vlm::generate(*m, b, o);
  size_t cut = 0;
  while (free_run.tokens[0][cut] != stop) ++cut;
  EXPECT_EQ(g.tokens[0].size(), cut + 1);
  EXPECT_EQ(g.tokens[0].back(), stop);
  for (int64_t t : g.tokens[0]) EXPECT_NE(t, m->cfg.image_token_id);
}

// stop_together decides when to stop (lockstep eval): called once per step with the local
// "all stopped" state, and generation ends exactly when it first returns true.
TEST(Generation, StopTogetherCallbackDecidesTheStep) {
  auto m = make_gen_model("tiny");
  auto b = prompts(m->cfg);
  vlm::GenerationOptions o;
  o.max_new_tokens = 8;
  auto free_run = vlm::generate(*m, b, o);
  o.stop_tokens = {free_run.tokens[0][1], free_run.tokens[1][1]};  // both stop at step 2
  std::vector<bool> seen;
  o.stop_together = [&](bool here) {
    seen.push_back(here);
    return seen.size() == 5;  // another rank is still busy until step 5
  };
  auto g = vlm::generate(*m, b, o);
  // Step k (0-based) has everything stopped once both rows emitted a stop token (at <= 1).
  size_t last_stop = 0;
  for (int i = 0; i < 2; ++i) {
    size_t p = 0;
    while (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), free_run.tokens[i][p]) == o.stop_tokens.end()) ++p;
    EXPECT_EQ(g.tokens[i].size(), p + 1);  // nothing recorded after the stop token
    last_stop = std::max(last_stop, p);
  }
  ASSERT_EQ(seen.size(), 5u);
  for (size_t k = 0; k < 5; ++k) EXPECT_EQ(seen[k], k >= last_stop) << k;
  o.stop_together = [&](bool) { return false; };  // never: runs to max_new_tokens
  o.keep_logits = true;
  EXPECT_EQ(vlm::generate(*m, b, o).logits.size(1), 8);
}

TEST(Generation, SamplingIsSeededAndTopPOfZeroIsGreedy) {
  auto m = make_gen_model("tiny");
  auto b = prompts(m->cfg);
  vlm::GenerationOptions o;
  o.max_new_tokens = 6;
  o.run_to_max = true;
  auto greedy = vlm::generate(*m, b, o);
  o.temperature = 1.0;
  o.top_p = 1e-9;  // only the most likely token survives the nucleus
  EXPECT_EQ(vlm::generate(*m, b, o).tokens, greedy.tokens);
  o.top_p = 1.0;
  o.seed = 42;
  auto s1 = vlm::generate(*m, b, o);
  auto s2 = vlm::generate(*m, b, o);
  EXPECT_EQ(s1.tokens, s2.tokens);
}

}  // namespace
