// Generation with the KV cache against full recomputation of the whole sequence at every
// step (same tokens, logits within 1e-5), batched with left padding and images, for every
// family (Qwen3-VL: DeepStack at the prefill only); stop tokens; sampling determinism.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/io/safetensors.h"
#include "vlm/model/generation.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"

namespace {

vlm::VisionLanguageModel make_gen_model(const std::string& preset) {
  vlm::VisionLanguageModel m(vlm::preset(preset), torch::TensorOptions().device(torch::kMeta));
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
INSTANTIATE_TEST_SUITE_P(Families, Gen, ::testing::Values("tiny", "tiny-qwen2.5", "tiny-qwen3", "tiny-qwen3.5"));

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

// ---------------------------------------------------------------- repetition penalty, top-k
// The penalty against its definition (HF RepetitionPenaltyLogitsProcessor), on a tiny model
// whose logits we recompute by full forwards: the first generated token is the argmax of
// the penalised last-position logits, where every token of the prompt from the first
// unmasked column on (not the left padding) counts as seen.
namespace gen_penalty_test {

TEST(GenerationPenalty, FirstTokenIsArgmaxOfPenalisedLogitsPaddingExcluded) {
  vlm::VisionLanguageModel m(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 11});
  m->eval();
  const auto& c = m->cfg;
  // Row 0 is left-padded with a pad id that also appears nowhere in its prompt.
  const int64_t pad = 3;
  auto ids = torch::tensor(std::vector<int64_t>{pad, pad, 40, 41, 40, 42, 50, 51, 52, 53, 54, 55}).view({2, 6});
  auto mask = torch::tensor(std::vector<int64_t>{0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}).view({2, 6});
  vlm::Batch b;
  b.input_ids = ids;
  b.attention_mask = mask;
  vlm::GenerationOptions o;
  o.max_new_tokens = 1;
  o.keep_logits = true;
  o.suppress_vision_pads = false;
  auto plain = vlm::generate(*m, b, o);
  const auto logits = plain.logits.select(1, 0);  // [2, V]
  for (double penalty : {1.7, 0.6}) {
    SCOPED_TRACE(penalty);
    o.repetition_penalty = penalty;
    auto out = vlm::generate(*m, b, o);
    for (int64_t r = 0; r < 2; ++r) {
      auto expect = logits[r].clone();
      for (int64_t j = 0; j < 6; ++j) {
        if (r == 0 && j < 2) continue;  // left padding: not seen
        const int64_t t = ids[r][j].item<int64_t>();
        const float x = logits[r][t].item<float>();
        expect[t] = x < 0 ? x * float(penalty) : x / float(penalty);
      }
      EXPECT_EQ(out.tokens[r][0], expect.argmax().item<int64_t>()) << "row " << r;
    }
  }
  // The penalty changes the choice somewhere: make the argmax token of row 1 appear in its
  // prompt and penalise it hard.
  const int64_t top = logits[1].argmax().item<int64_t>();
  auto ids2 = ids.clone();
  ids2[1][0] = top;
  b.input_ids = ids2;
  o.repetition_penalty = 1e6;
  auto out = vlm::generate(*m, b, o);
  EXPECT_NE(out.tokens[1][0], top);
  (void)c;
}

TEST(GenerationPenalty, TopKOfOneIsGreedyAtAnyTemperature) {
  vlm::VisionLanguageModel m(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 5});
  m->eval();
  vlm::Batch b;
  b.input_ids = torch::tensor({7, 8, 9, 10, 11}, torch::kInt64).view({1, 5});
  vlm::GenerationOptions greedy;
  greedy.max_new_tokens = 8;
  auto g = vlm::generate(*m, b, greedy);
  vlm::GenerationOptions hot = greedy;
  hot.temperature = 50.0;  // nearly uniform without top_k
  hot.top_k = 1;
  for (uint64_t seed : {1u, 2u, 3u}) {
    hot.seed = seed;
    EXPECT_EQ(vlm::generate(*m, b, hot).tokens, g.tokens) << "seed " << seed;
  }
}

TEST(GenerationConfigFile, HfDefaultsOverridesAndErrors) {
  const auto d = vlm::parse_generation_config("{}", "g.json");
  EXPECT_FALSE(d.do_sample);
  EXPECT_EQ(d.temperature, 1.0);
  EXPECT_EQ(d.top_k, 50);
  EXPECT_EQ(d.top_p, 1.0);
  EXPECT_EQ(d.repetition_penalty, 1.0);
  EXPECT_TRUE(d.eos_token_ids.empty());
  EXPECT_FALSE(d.pad_token_id.has_value());
  const auto g = vlm::parse_generation_config(
      R"({"do_sample": true, "top_k": 1, "top_p": 0.001, "temperature": 0.01,
          "repetition_penalty": 1.05, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
          "bos_token_id": 151643, "transformers_version": "4.37.0"})",
      "g.json");
  EXPECT_TRUE(g.do_sample);
  EXPECT_EQ(g.top_k, 1);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(*g.pad_token_id, 151643);
  vlm::GenerationOptions base;
  base.max_new_tokens = 9;
  const auto o = vlm::to_options(g, base);
  EXPECT_EQ(o.max_new_tokens, 9);
  EXPECT_EQ(o.temperature, 0.01);
  EXPECT_EQ(o.top_k, 1);
  EXPECT_EQ(o.repetition_penalty, 1.05);
  EXPECT_EQ(o.stop_tokens, g.eos_token_ids);
  EXPECT_EQ(o.pad_token_id, 151643);
  const auto greedy = vlm::to_options(vlm::parse_generation_config(R"({"eos_token_id": 2, "top_k": 3})", "x"));
  EXPECT_EQ(greedy.temperature, 0.0);  // do_sample false: top_k unused
  EXPECT_EQ(greedy.top_k, 0);
  EXPECT_EQ(greedy.stop_tokens, (std::vector<int64_t>{2}));
  for (const char* bad : {R"({"repetition_penalty": 0})", R"({"top_k": -1})", R"({"top_p": 1.5})",
                          R"({"do_sample": true, "temperature": 0})", R"({"eos_token_id": "x"})",
                          R"({"do_sample": "yes"})", "[1]", "{"}) {
    try {
      vlm::parse_generation_config(bad, "model/generation_config.json");
      ADD_FAILURE() << "no error for " << bad;
    } catch (const vlm::Error& e) {
      EXPECT_NE(std::string(e.what()).find("model/generation_config.json"), std::string::npos) << e.what();
    }
  }
  vlm::test::TempDir dir("gencfg");
  EXPECT_EQ(vlm::load_generation_config(dir.path()).source, "");  // no file: defaults
  vlm::test::write_file(dir / "generation_config.json", R"({"repetition_penalty": 1.2})");
  const auto f = vlm::load_generation_config(dir.path());
  EXPECT_EQ(f.repetition_penalty, 1.2);
  EXPECT_EQ(f.source, dir / "generation_config.json");
}

}  // namespace gen_penalty_test

// ---------------------------------------------------------------- HF generate parity
// Greedy decoding (and the near-greedy sampling of the Qwen2-VL-Instruct
// generation_config.json) with HF's repetition penalty, token for token against
// transformers' model.generate at test time. scripts/generate_reference.py builds tiny
// random Qwen2-VL and Qwen2.5-VL models whose vocabulary is the real tokenizer's (151,936
// rows), saves them with save_pretrained, writes one generation_config.json per setting
// (greedy + penalty 1.3; do_sample + top_k 1 + top_p 0.001 + temperature 0.01 + penalty
// 1.05; greedy without penalty), renders the prompts with Qwen2VLProcessor (real tokenizer,
// Qwen2-VL chat template, HF image processor) and runs HF generate on 3 left-padded
// batches: two rows with images, three rows mixing images and text only, two text-only
// rows. vlmtrain loads the same model directory (load_hf_config, load_module_weights),
// reads the same generation_config.json (load_generation_config -> to_options) and
// generates from the same input_ids / pixel_values. Required: every generated token equal
// (up to and including the first eos of each row; eos ids are read from the file, one of
// them chosen so that some rows stop early), and the penalty settings change the tokens
// of at least one batch compared with no penalty (else the test would not test it).
namespace gen_hf_test {

std::string tokenizer_dir() { return vlm::test::qwen_tokenizer_dir(); }

struct Reference {
  std::unique_ptr<vlm::test::TempDir> dir;
  nlohmann::json manifest;
};

const Reference& reference() {
  static Reference ref = [] {
    Reference r;
    r.dir = std::make_unique<vlm::test::TempDir>("gen_hf");
    const std::string python = vlm::test::python_tool("python");  // throws, with a hint, if missing
    auto res = vlm::test::run({python, vlm::test::source_dir() + "/scripts/generate_reference.py",
                             "--tokenizer", tokenizer_dir(), "--out", r.dir->path()},
                            std::chrono::seconds(300));
    if (res.exit_code != 0)
      throw std::runtime_error("scripts/generate_reference.py failed (" + python + "):\n" + res.output);
    r.manifest = nlohmann::json::parse(vlm::test::read_file(*r.dir / "manifest.json"));
    return r;
  }();
  return ref;
}

class GenHf : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Families, GenHf, ::testing::Values("qwen2_vl", "qwen2_5_vl", "qwen3_vl"));

TEST_P(GenHf, TokensEqualTransformersGenerate) {
  ASSERT_TRUE(vlm::test::file_exists(tokenizer_dir() + "/tokenizer.json"))
      << "missing reference tokenizer " << tokenizer_dir() << "/tokenizer.json";
  const Reference& ref = reference();
  const std::string family = GetParam();
  const std::string model_dir = *ref.dir / family;
  const auto cfg = vlm::load_hf_config(model_dir);
  vlm::VisionLanguageModel m(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 0, 0.02, /*init=*/false});
  vlm::load_module_weights(*m, model_dir);
  m->eval();
  const int64_t max_new = ref.manifest["max_new_tokens"];
  int64_t rows = 0, tokens = 0, stopped_early = 0;
  std::map<std::string, std::map<std::string, std::vector<std::vector<int64_t>>>> got;  // setting -> batch
  for (const auto& setting_j : ref.manifest["settings"]) {
    const std::string setting = setting_j.get<std::string>();
    const auto gc = vlm::load_generation_config(model_dir + "/" + setting);
    ASSERT_FALSE(gc.source.empty()) << "no generation_config.json in " << model_dir << "/" << setting;
    vlm::GenerationOptions base;
    base.max_new_tokens = max_new;
    base.suppress_vision_pads = false;  // HF has no such rule
    const auto opts = vlm::to_options(gc, base);
    for (const auto& batch_j : ref.manifest["batches"]) {
      const std::string batch = batch_j.get<std::string>();
      const std::string name = family + "." + setting + "." + batch;
      SCOPED_TRACE(name);
      auto f = vlm::SafetensorsFile::open(*ref.dir / (name + ".safetensors"));
      vlm::Batch b;
      b.input_ids = f.get("input_ids").clone();
      b.attention_mask = f.get("attention_mask").clone();
      if (f.contains("pixel_values")) {
        b.pixel_values = f.get("pixel_values").clone();
        b.image_grid_thw = f.get("image_grid_thw").clone();
      }
      const auto hf = f.get("generated").clone();
      const auto out = vlm::generate(*m, b, opts);
      ASSERT_EQ(static_cast<int64_t>(out.tokens.size()), hf.size(0));
      for (int64_t r = 0; r < hf.size(0); ++r) {
        std::vector<int64_t> want;
        for (int64_t j = 0; j < max_new && hf[r][j].item<int64_t>() >= 0; ++j) want.push_back(hf[r][j].item<int64_t>());
        EXPECT_EQ(out.tokens[size_t(r)], want) << "row " << r;
        ++rows;
        tokens += static_cast<int64_t>(want.size());
        stopped_early += static_cast<int64_t>(want.size()) < max_new;
      }
      got[setting][batch] = out.tokens;
    }
  }
  // The penalty must matter on these models, or equality above would not test it.
  int differing = 0;
  for (const auto& [batch, toks] : got["greedy_plain"]) differing += toks != got["greedy_penalty"][batch];
  EXPECT_GT(differing, 0) << "repetition_penalty 1.3 changed no batch: the parity test does not exercise it";
  EXPECT_GT(stopped_early, 0) << "no row stopped at an eos: stopping is not exercised";
  std::cout << family << ": " << tokens << " generated tokens in " << rows
            << " rows equal to HF generate (" << stopped_early << " rows stopped at an eos; penalty "
            << "changed " << differing << " of " << got["greedy_plain"].size() << " batches)\n";
}

}  // namespace gen_hf_test
