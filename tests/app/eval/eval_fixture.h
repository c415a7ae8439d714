// Shared by the evaluator tests: a tiny random model whose vocabulary is the test BPE
// tokenizer's (tests/vlm/text/tokenizer_tiny_bpe.h), and small eval sets written to disk:
//   lines.jsonl  plain OCR records, noise images of different sizes (so prompts differ in
//                length and batches are left-padded)
//                (record 2 has an "answers" list instead of "text")
//   chat.jsonl   messages records: one text-only prompt, two with an image
#pragma once
#include <opencv2/imgcodecs.hpp>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "app/config/model_source.h"
#include "app/config/recipe.h"
#include "tests/testing.h"
#include "tests/vlm/text/tokenizer_tiny_bpe.h"
#include "vlm/text/bpe_tokenizer.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::test {

inline std::string tiny_tokenizer_json() { return make_tiny_model(/*with_vision=*/true).j.dump(); }

inline std::unique_ptr<vlm::Tokenizer> tiny_tokenizer() {
  return vlm::BpeTokenizer::from_json_text(tiny_tokenizer_json(), "tiny_bpe.json");
}

// Preset "tiny" with the tokenizer's vocabulary size and special ids.
inline vlm::VlmConfig tiny_eval_config(const vlm::Tokenizer& tok) {
  vlm::VlmConfig cfg = vlm::preset("tiny");
  cfg.text.vocab_size = tok.vocab_size();
  vlm::app::use_tokenizer_special_ids(cfg, tok);
  return cfg;
}

// Initialised wider than HF's 0.02 so that the answers depend on the prompt and the image
// (at 0.02 the last prompt token decides everything and every answer is the same).
inline vlm::VisionLanguageModel tiny_eval_model(const vlm::Tokenizer& tok, uint64_t seed = 3) {
  vlm::VisionLanguageModel m(tiny_eval_config(tok), torch::TensorOptions().device(torch::kMeta));
  vlm::MaterializeOptions o{torch::kCPU, torch::kFloat32, seed};
  o.init_std = 0.3;
  vlm::materialize(*m, o);
  return m;
}

// A noise image h x w (PNG) at `path`.
inline void write_noise_png(const std::string& path, int h, int w, unsigned seed) {
  cv::Mat img(h, w, CV_8UC3);
  cv::randu(img, cv::Scalar::all(0), cv::Scalar::all(255));
  std::mt19937 rng(seed);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) img.at<cv::Vec3b>(y, x)[rng() % 3] = uint8_t(rng() % 256);
  VLM_CHECK(cv::imwrite(path, img), "cannot write ", path);
}

// Writes lines.jsonl (n_lines records) and chat.jsonl (3 records) into `dir`.
inline void write_eval_sets(const std::string& dir, int n_lines = 7) {
  const std::vector<std::string> texts = {"hello world", "the world", "abab", "hello",
                                          "12 the", "world hello the", "aaaa", "ing", "the 12"};
  const int sizes[][2] = {{28, 56}, {56, 56}, {28, 84}, {56, 112}, {28, 28}, {42, 70}};
  std::string lines;
  for (int i = 0; i < n_lines; ++i) {
    const std::string img = "l" + std::to_string(i) + ".png";
    write_noise_png(dir + "/" + img, sizes[i % 6][0], sizes[i % 6][1], unsigned(i));
    nlohmann::json rec = {{"image", img}, {"text", texts[size_t(i) % texts.size()]}};
    if (i == 2) rec = {{"image", img}, {"answers", {"abab", "ab ab"}}};  // VQA-style references
    lines += rec.dump() + "\n";
  }
  write_file(dir + "/lines.jsonl", lines);
  write_noise_png(dir + "/c1.png", 56, 84, 99);
  write_file(dir + "/chat.jsonl",
             R"({"messages":[{"role":"user","content":"hello the world"},{"role":"assistant","content":"world"}]})" "\n"
             R"({"messages":[{"role":"user","content":"<image>the"},{"role":"assistant","content":"hello"}],"images":["c1.png"]})" "\n"
             R"({"messages":[{"role":"user","content":"<image>abab"},{"role":"assistant","content":"12"}],"images":["c1.png"]})" "\n");
}

// A recipe for these sets: small image budget, the plain-OCR prompt, one loader thread.
inline vlm::app::Recipe eval_recipe(const std::string& dir) {
  return vlm::app::parse_recipe(
      "[model]\npreset = \"tiny\"\ntokenizer = \"" + dir + "/tokenizer.json\"\n"
      "[data]\neval = [\"" + dir + "/lines.jsonl\", \"" + dir + "/chat.jsonl\"]\n"
      "prompt = \"Read the text.\"\nmax_image_tokens = 16\nnum_workers = 1\n"
      "[eval]\nmax_new_tokens = 6\nbatch_size = 3\n",
      "eval_test.toml");
}

}  // namespace vlm::test
