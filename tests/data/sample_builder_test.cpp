// Sample building: for each dataset format (messages, llava, plain OCR), single and multi
// image and text-only, input_ids and labels must equal sequences built here independently:
// the expected ChatML text written out by hand (image pads already expanded), encoded with
// the tokenizer in one call; the supervised span is [len(encode(prefix)), len(encode(prefix
// + answer + "<|im_end|>\n"))). The tokenizer is a tiny sentencepiece model trained here
// (vlm::train_sentencepiece, vlm::sp_trainer_flags()): its corpus has no newline, so "\n" is
// always the byte piece <0x0A> and encodings are prefix-stable at the cut points used.
// Pixel side: pixel_values rows = sum of t*gh*gw, rows equal each image's own
// process_image() output in prompt order, pad runs = t*gh*gw/4.
#include <gtest/gtest.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <random>

#include "data/dataset.h"
#include "data/image.h"
#include "data/sample_builder.h"
#include "data/token_counts.h"
#include "tests/require_sentencepiece.h"
#include "tests/testing.h"
#include "vlm/text/sp_tokenizer.h"

namespace {

using vlm::data::Record;

const std::string kSys = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";

std::string pads(int64_t n) {
  std::string s = "<|vision_start|>";
  for (int64_t i = 0; i < n; ++i) s += "<|image_pad|>";
  return s + "<|vision_end|>";
}

std::string train_tokenizer(const std::string& dir, int vocab, uint32_t seed) {
  const std::vector<std::string> words = {"read", "the", "text", "in", "image", "hello",
                                          "world", "invoice", "total", "12.50", "compare",
                                          "left", "right", "OCR", "user", "assistant",
                                          "system", "You", "are", "a", "helpful", "Read"};
  std::mt19937 rng(seed);
  std::string corpus;
  for (int i = 0; i < 2000; ++i) {
    std::string line;
    for (int k = 1 + int(rng() % 8); k > 0; --k) line += (line.empty() ? "" : " ") + words[rng() % words.size()];
    corpus += line + "\n";
  }
  vlm::test::write_file(dir + "/corpus.txt", corpus);
  vlm::train_sentencepiece("--input=" + dir + "/corpus.txt --model_prefix=" + dir + "/tok" +
                           " --vocab_size=" + std::to_string(vocab) +
                           " --model_type=unigram --character_coverage=1.0 --hard_vocab_limit=false"
                           " --num_threads=1 " + vlm::sp_trainer_flags());
  return dir + "/tok.model";
}

class SampleBuilder : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!vlm::sentencepiece_available()) return;  // every test skips (SetUp)
    dir_ = new vlm::test::TempDir("samples");
    tok_ = vlm::load_tokenizer(train_tokenizer(dir_->path(), 320, 1)).release();
    // 56x84 -> grid (1,4,6), 6 tokens; 112x56 -> (1,8,4), 8 tokens; 60x200 -> 56x196 (1,4,14), 14.
    write_image("a.png", 56, 84, 1);
    write_image("b.png", 112, 56, 2);
    write_image("c.png", 60, 200, 3);
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete dir_;
  }
  void SetUp() override { VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE(); }
  static void write_image(const std::string& name, int h, int w, int seed) {
    cv::Mat m(h, w, CV_8UC3);
    cv::randu(m, cv::Scalar::all(0), cv::Scalar::all(255));
    cv::putText(m, std::to_string(seed), {2, h - 4}, cv::FONT_HERSHEY_SIMPLEX, 0.5, {0, 0, 0});
    ASSERT_TRUE(cv::imwrite((*dir_) / name, m));
  }
  static vlm::data::Dataset load(const std::string& name, const std::string& jsonl,
                                 const std::string& ocr_prompt = "Read the text.") {
    vlm::test::write_file((*dir_) / name, jsonl);
    vlm::data::DatasetOptions o;
    o.ocr_prompt = ocr_prompt;
    o.use_index_cache = false;
    o.warn = [](const std::string&) {};
    return vlm::data::load_dataset({(*dir_) / name}, o);
  }
  static std::vector<int64_t> enc(const std::string& s) { return tok_->encode(s); }
  // Expected labels: supervised [len(enc(prefix_i)), len(enc(prefix_i + answer_i))) spans.
  static std::vector<int64_t> expected_labels(const std::vector<int64_t>& ids,
                                              const std::vector<std::pair<std::string, std::string>>& spans) {
    std::vector<int64_t> labels(ids.size(), vlm::kIgnoreIndex);
    for (const auto& [prefix, with_answer] : spans) {
      const auto a = enc(prefix), b = enc(with_answer);
      EXPECT_TRUE(std::equal(a.begin(), a.end(), ids.begin())) << "prefix-stable encoding";
      EXPECT_TRUE(std::equal(b.begin(), b.end(), ids.begin())) << "prefix-stable encoding";
      for (size_t i = a.size(); i < b.size(); ++i) labels[i] = ids[i];
    }
    return labels;
  }
  static void expect_pixels(const vlm::TokenizedSample& s, const Record& r,
                            const std::vector<int64_t>& tokens) {
    ASSERT_EQ(s.grid_thw.size(), tokens.size());
    int64_t rows = 0;
    std::vector<torch::Tensor> ref;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto& g = s.grid_thw[i];
      EXPECT_EQ(g[0] * g[1] * g[2] / 4, tokens[i]) << "image " << i;
      rows += g[0] * g[1] * g[2];
      ref.push_back(vlm::data::process_image(vlm::data::decode_image_rgb(r.images[i].path)).pixel_values);
    }
    if (tokens.empty()) {
      EXPECT_FALSE(s.pixel_values.defined());
      return;
    }
    ASSERT_TRUE(s.pixel_values.defined());
    EXPECT_EQ(s.pixel_values.size(0), rows);
    EXPECT_EQ(s.pixel_values.size(1), 1176);
    EXPECT_TRUE(torch::equal(s.pixel_values, torch::cat(ref, 0)));
    // Pad runs in input_ids, in order, have the images' token counts.
    const int64_t pad = tok_->special_id("<|image_pad|>");
    std::vector<int64_t> runs;
    for (size_t i = 0; i < s.input_ids.size(); ++i)
      if (s.input_ids[i] == pad) {
        if (i == 0 || s.input_ids[i - 1] != pad) runs.push_back(0);
        ++runs.back();
      }
    EXPECT_EQ(runs, tokens);
  }
  static vlm::test::TempDir* dir_;
  static vlm::Tokenizer* tok_;
};
vlm::test::TempDir* SampleBuilder::dir_ = nullptr;
vlm::Tokenizer* SampleBuilder::tok_ = nullptr;

TEST_F(SampleBuilder, MessagesSingleImage) {
  auto ds = load("m.jsonl",
                 R"({"messages":[{"role":"user","content":"<image>Read the text."},)"
                 R"({"role":"assistant","content":"hello world"}],"images":["a.png"]})" "\n");
  const Record& r = ds.records.at(0);
  auto s = vlm::data::load_sample(*tok_, r, {}, {}, 7);
  const std::string prefix = kSys + "<|im_start|>user\n" + pads(6) + "Read the text.<|im_end|>\n"
                             "<|im_start|>assistant\n";
  const std::string full = prefix + "hello world<|im_end|>\n";
  EXPECT_EQ(s.index, 7);
  EXPECT_EQ(s.input_ids, enc(full));
  EXPECT_EQ(s.labels, expected_labels(s.input_ids, {{prefix, full}}));
  expect_pixels(s, r, {6});
}

TEST_F(SampleBuilder, LlavaMultiImageMultiTurnWithSystemPrompt) {
  auto ds = load("l.jsonl",
                 R"({"image":["a.png","b.png"],"conversations":[)"
                 R"({"from":"human","value":"<image>\n<image>\ncompare left right"},)"
                 R"({"from":"gpt","value":"left total"},)"
                 R"({"from":"human","value":"and the text"},{"from":"gpt","value":"hello"}]})" "\n");
  const Record& r = ds.records.at(0);
  vlm::data::SampleOptions o;
  o.system_prompt = "You are OCR.";
  auto s = vlm::data::load_sample(*tok_, r, {}, o);
  const std::string sys = "<|im_start|>system\nYou are OCR.<|im_end|>\n";
  const std::string p1 = sys + "<|im_start|>user\n" + pads(6) + "\n" + pads(8) +
                         "\ncompare left right<|im_end|>\n<|im_start|>assistant\n";
  const std::string f1 = p1 + "left total<|im_end|>\n";
  const std::string p2 = f1 + "<|im_start|>user\nand the text<|im_end|>\n<|im_start|>assistant\n";
  const std::string f2 = p2 + "hello<|im_end|>\n";
  EXPECT_EQ(s.input_ids, enc(f2));
  EXPECT_EQ(s.labels, expected_labels(s.input_ids, {{p1, f1}, {p2, f2}}));
  expect_pixels(s, r, {6, 8});
}

TEST_F(SampleBuilder, PlainOcrAndRecordSystemTurn) {
  auto ds = load("p.jsonl", R"({"image":"c.png","text":"invoice 12.50"})" "\n", "Read the text.");
  const Record& r = ds.records.at(0);
  auto s = vlm::data::load_sample(*tok_, r, {}, {});
  const std::string prefix = kSys + "<|im_start|>user\n" + pads(14) +
                             "Read the text.<|im_end|>\n<|im_start|>assistant\n";
  const std::string full = prefix + "invoice 12.50<|im_end|>\n";
  EXPECT_EQ(s.input_ids, enc(full));
  EXPECT_EQ(s.labels, expected_labels(s.input_ids, {{prefix, full}}));
  expect_pixels(s, r, {14});

  // system_prompt "none": no system turn at all (the sequence starts at the user turn).
  vlm::data::SampleOptions none;
  none.system_prompt = vlm::data::kNoSystemTurn;
  auto sn = vlm::data::load_sample(*tok_, r, {}, none);
  const std::string prefix_n = "<|im_start|>user\n" + pads(14) + "Read the text.<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(sn.input_ids, enc(prefix_n + "invoice 12.50<|im_end|>\n"));
  EXPECT_EQ(sn.labels, expected_labels(sn.input_ids, {{prefix_n, prefix_n + "invoice 12.50<|im_end|>\n"}}));

  // A record's own system turn wins over the recipe's system prompt.
  auto ds2 = load("m2.jsonl",
                  R"({"messages":[{"role":"system","content":"You are a helpful OCR"},)"
                  R"({"role":"user","content":"Read <image> and <image>"},)"
                  R"({"role":"assistant","content":"text"}],"images":["b.png","c.png"]})" "\n");
  vlm::data::SampleOptions o;
  o.system_prompt = "ignored";
  auto s2 = vlm::data::load_sample(*tok_, ds2.records.at(0), {}, o);
  const std::string p2 = "<|im_start|>system\nYou are a helpful OCR<|im_end|>\n<|im_start|>user\nRead " +
                         pads(8) + " and " + pads(14) + "<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(s2.input_ids, enc(p2 + "text<|im_end|>\n"));
  EXPECT_EQ(s2.labels, expected_labels(s2.input_ids, {{p2, p2 + "text<|im_end|>\n"}}));
  expect_pixels(s2, ds2.records.at(0), {8, 14});
}

TEST_F(SampleBuilder, TextOnly) {
  auto ds = load("t.jsonl", R"({"messages":[{"role":"user","content":"hello"},)"
                            R"({"role":"assistant","content":"world"}]})" "\n");
  auto s = vlm::data::load_sample(*tok_, ds.records.at(0), {}, {});
  const std::string prefix = kSys + "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(s.input_ids, enc(prefix + "world<|im_end|>\n"));
  EXPECT_EQ(s.labels, expected_labels(s.input_ids, {{prefix, prefix + "world<|im_end|>\n"}}));
  expect_pixels(s, ds.records.at(0), {});
}

TEST_F(SampleBuilder, ResizeTargetsFromCaller) {
  auto ds = load("m3.jsonl",
                 R"({"messages":[{"role":"user","content":"<image>Read the text."},)"
                 R"({"role":"assistant","content":"hello"}],"images":["c.png"]})" "\n");
  // The step plan's budget: 28x56 -> grid (1,2,4), 2 merged tokens.
  auto s = vlm::data::load_sample(*tok_, ds.records.at(0), {}, {}, 0, {{28, 56}});
  ASSERT_EQ(s.grid_thw.size(), 1u);
  EXPECT_EQ(s.grid_thw[0], (std::array<int64_t, 3>{1, 2, 4}));
  EXPECT_EQ(s.pixel_values.size(0), 8);
  const std::string prefix = kSys + "<|im_start|>user\n" + pads(2) +
                             "Read the text.<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(s.input_ids, enc(prefix + "hello<|im_end|>\n"));
}

TEST_F(SampleBuilder, Truncation) {
  auto ds = load("tr.jsonl",
                 R"({"messages":[{"role":"user","content":"<image>Read the text."},)"
                 R"({"role":"assistant","content":"hello world invoice total"},)"
                 R"({"role":"user","content":"and <image>"},)"
                 R"({"role":"assistant","content":"left"}],"images":["a.png","c.png"]})" "\n");
  const Record& r = ds.records.at(0);
  const auto images = vlm::data::load_record_images(r, {});
  const auto full = vlm::data::build_sample(*tok_, r, images, {});
  const std::string p1 = kSys + "<|im_start|>user\n" + pads(6) +
                         "Read the text.<|im_end|>\n<|im_start|>assistant\n";
  const int64_t answer_begin = int64_t(enc(p1).size());
  const int64_t img2_begin = int64_t(enc(p1 + "hello world invoice total<|im_end|>\n"
                                         "<|im_start|>user\nand <|vision_start|>").size());
  vlm::data::SampleOptions o;

  // No cut needed: identical.
  o.max_length = int64_t(full.input_ids.size());
  EXPECT_EQ(vlm::data::build_sample(*tok_, r, images, o).input_ids, full.input_ids);

  // Safe cut inside the first answer: a prefix of the full sample, first image only.
  o.max_length = answer_begin + 2;
  auto s = vlm::data::build_sample(*tok_, r, images, o);
  ASSERT_EQ(int64_t(s.input_ids.size()), answer_begin + 2);
  EXPECT_TRUE(std::equal(s.input_ids.begin(), s.input_ids.end(), full.input_ids.begin()));
  EXPECT_TRUE(std::equal(s.labels.begin(), s.labels.end(), full.labels.begin()));
  EXPECT_EQ(std::count_if(s.labels.begin(), s.labels.end(), [](int64_t l) { return l != -100; }), 2);
  expect_pixels(s, r, {6});

  // Cut exactly where image 2's pads begin: image 2 dropped with its pixel rows.
  o.max_length = img2_begin;
  s = vlm::data::build_sample(*tok_, r, images, o);
  EXPECT_EQ(int64_t(s.input_ids.size()), img2_begin);
  expect_pixels(s, r, {6});
  // Cut right after image 2's pads: both images kept.
  o.max_length = img2_begin + 14;
  s = vlm::data::build_sample(*tok_, r, images, o);
  expect_pixels(s, r, {6, 14});

  // Inside image 2 -> skipped with a reason.
  for (int64_t cut : {img2_begin + 1, img2_begin + 13}) {
    o.max_length = cut;
    try {
      vlm::data::build_sample(*tok_, r, images, o);
      ADD_FAILURE() << "cut " << cut << " inside image 2 must throw";
    } catch (const vlm::data::SampleSkip& e) {
      EXPECT_EQ(e.reason, "cut inside image");
      EXPECT_NE(std::string(e.what()).find("image 1"), std::string::npos) << e.what();
    }
  }
  // Inside image 1 (6 pads after kSys + "<|im_start|>user\n<|vision_start|>").
  o.max_length = int64_t(enc(kSys + "<|im_start|>user\n<|vision_start|>").size()) + 3;
  EXPECT_THROW(vlm::data::build_sample(*tok_, r, images, o), vlm::data::SampleSkip);
  // Before any answer token -> no supervised tokens.
  o.max_length = answer_begin;
  try {
    vlm::data::build_sample(*tok_, r, images, o);
    ADD_FAILURE() << "must throw";
  } catch (const vlm::data::SampleSkip& e) {
    EXPECT_EQ(e.reason, "no supervised tokens");
  }
}

TEST_F(SampleBuilder, GenerationPrompt) {
  // One file per format (the format is detected once per file).
  auto m = load("g1.jsonl",
                R"({"messages":[{"role":"user","content":"<image>Read the text."},)"
                R"({"role":"assistant","content":"hello world"}],"images":["b.png"]})" "\n"
                R"({"messages":[{"role":"user","content":"<image>first"},)"
                R"({"role":"assistant","content":"left"},{"role":"user","content":"<image>second"},)"
                R"({"role":"assistant","content":"right"}],"images":["a.png","c.png"]})" "\n");
  auto p = load("g2.jsonl", R"({"image":"a.png","text":"total","answers":["total","Total"]})" "\n");
  vlm::data::Dataset ds;
  ds.records = {m.records.at(0), p.records.at(0), m.records.at(1)};
  ASSERT_EQ(ds.records.size(), 3u);
  auto g = vlm::data::build_generation_prompt(*tok_, ds.records[0],
                                              vlm::data::load_record_images(ds.records[0], {}), {});
  EXPECT_EQ(g.sample.input_ids, enc(kSys + "<|im_start|>user\n" + pads(8) +
                                    "Read the text.<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_TRUE(std::all_of(g.sample.labels.begin(), g.sample.labels.end(),
                          [](int64_t l) { return l == -100; }));
  EXPECT_EQ(g.sample.labels.size(), g.sample.input_ids.size());
  EXPECT_EQ(g.references, std::vector<std::string>{"hello world"});
  expect_pixels(g.sample, ds.records[0], {8});

  g = vlm::data::build_generation_prompt(*tok_, ds.records[1],
                                         vlm::data::load_record_images(ds.records[1], {}), {});
  EXPECT_EQ(g.references, (std::vector<std::string>{"total", "Total"}));
  // Multi-turn: context up to the last assistant turn; only the first image is in it.
  g = vlm::data::build_generation_prompt(*tok_, ds.records[2],
                                         vlm::data::load_record_images(ds.records[2], {}), {});
  EXPECT_EQ(g.sample.input_ids,
            enc(kSys + "<|im_start|>user\n" + pads(6) + "first<|im_end|>\n<|im_start|>assistant\n"
                "left<|im_end|>\n<|im_start|>user\n" + pads(14) +
                "second<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_EQ(g.references, std::vector<std::string>{"right"});
  expect_pixels(g.sample, ds.records[2], {6, 14});
}

TEST_F(SampleBuilder, ImageCountMustMatchRecord) {
  auto ds = load("e.jsonl",
                 R"({"messages":[{"role":"user","content":"<image>Read the text."},)"
                 R"({"role":"assistant","content":"hello"}],"images":["a.png"]})" "\n");
  vlm::data::RecordImages none;
  EXPECT_THROW(vlm::data::build_sample(*tok_, ds.records[0], none, {}), vlm::Error);
}

// ------------------------------------------------------------------ text token counts

TEST_F(SampleBuilder, TextTokenCountsMatchFullRenderAndCache) {
  const std::string jsonl =
      R"({"messages":[{"role":"user","content":"<image>Read the text."},)"
      R"({"role":"assistant","content":"hello world"}],"images":["a.png"]})" "\n"
      R"({"image":["a.png","b.png"],"conversations":[{"from":"human","value":"<image><image>compare"},)"
      R"({"from":"gpt","value":"left"},{"from":"human","value":"more"},{"from":"gpt","value":"right total"}]})" "\n"
      R"({"messages":[{"role":"user","content":"hello"},{"role":"assistant","content":"world"}]})" "\n";
  vlm::data::DatasetOptions dopt;
  dopt.warn = [](const std::string&) {};
  // The format is detected once per file: one file per format.
  vlm::test::write_file((*dir_) / "c1.jsonl", jsonl.substr(0, jsonl.find('\n') + 1));
  const size_t l2 = jsonl.find('\n') + 1, l3 = jsonl.find('\n', l2) + 1;
  vlm::test::write_file((*dir_) / "c2.jsonl", jsonl.substr(l2, l3 - l2));
  vlm::test::write_file((*dir_) / "c3.jsonl", jsonl.substr(l3));
  const std::vector<std::string> files = {(*dir_) / "c1.jsonl", (*dir_) / "c2.jsonl",
                                          (*dir_) / "c3.jsonl"};
  auto ds = vlm::data::load_dataset(files, dopt);
  ASSERT_EQ(ds.records.size(), 3u);

  vlm::data::SampleOptions so;
  vlm::data::TextCountStats st;
  auto counts = vlm::data::dataset_text_token_counts(ds, *tok_, so, true, &st);
  EXPECT_EQ(st.computed, 3);
  EXPECT_EQ(st.cached, 0);
  for (size_t i = 0; i < ds.records.size(); ++i) {
    auto s = vlm::data::load_sample(*tok_, ds.records[i], {}, so);
    int64_t img = 0;
    for (const auto& g : s.grid_thw) img += g[0] * g[1] * g[2] / 4;
    EXPECT_EQ(counts[i].text_tokens + img, int64_t(s.input_ids.size())) << i;
    EXPECT_EQ(counts[i].supervised_tokens,
              std::count_if(s.labels.begin(), s.labels.end(), [](int64_t l) { return l != -100; }))
        << i;
  }
  // Independent value for the text-only record: the whole ChatML text, encoded.
  const std::string t = kSys + "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nworld<|im_end|>\n";
  EXPECT_EQ(counts[2].text_tokens, int64_t(enc(t).size()));
  EXPECT_EQ(counts[2].supervised_tokens, int64_t(enc("world<|im_end|>\n").size()));

  // Second pass: all from the index files.
  auto again = vlm::data::dataset_text_token_counts(ds, *tok_, so, true, &st);
  EXPECT_EQ(st.cached, 3);
  EXPECT_EQ(st.computed, 0);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again[i].text_tokens, counts[i].text_tokens);
  // The image index rewrite by load_dataset (another key: verify_decode) keeps them.
  dopt.verify_decode = true;
  ds = vlm::data::load_dataset(files, dopt);
  vlm::data::dataset_text_token_counts(ds, *tok_, so, true, &st);
  EXPECT_EQ(st.cached, 3);
  EXPECT_NE(vlm::test::read_file(vlm::data::dataset_index_path(files[0])).find("\"images\""),
            std::string::npos);

  // Another system prompt: recounted, and the counts change by the prompt's tokens.
  so.system_prompt = "You are a helpful assistant. Read the text in the image";
  auto sys2 = vlm::data::dataset_text_token_counts(ds, *tok_, so, true, &st);
  EXPECT_EQ(st.computed, 3);
  EXPECT_EQ(sys2[2].text_tokens - counts[2].text_tokens,
            int64_t(enc("<|im_start|>system\n" + so.system_prompt + "<|im_end|>\n").size()) -
                int64_t(enc(kSys).size()));
  so.system_prompt.clear();

  // Another tokenizer (same words, other vocabulary size): the cache is invalid.
  vlm::test::TempDir other("samples_tok2");
  auto tok2 = vlm::load_tokenizer(train_tokenizer(other.path(), 340, 2));
  ASSERT_NE(vlm::data::tokenizer_identity(*tok2), vlm::data::tokenizer_identity(*tok_));
  auto c2 = vlm::data::dataset_text_token_counts(ds, *tok2, so, true, &st);
  EXPECT_EQ(st.computed, 3);
  EXPECT_EQ(c2[2].text_tokens, int64_t(tok2->encode(t).size()));
  // The same tokenizer loaded again (same content) has the same identity.
  auto tok1b = vlm::load_tokenizer(dir_->path() + "/tok.model");
  EXPECT_EQ(vlm::data::tokenizer_identity(*tok1b), vlm::data::tokenizer_identity(*tok_));
  vlm::data::dataset_text_token_counts(ds, *tok1b, so, true, &st);
  EXPECT_EQ(st.computed, 3) << "cache now holds tok2's counts";
  vlm::data::dataset_text_token_counts(ds, *tok_, so, true, &st);
  EXPECT_EQ(st.cached, 3);

  // A changed record (rewritten JSONL) is recounted.
  vlm::test::write_file(files[2], R"({"messages":[{"role":"user","content":"hello hello"},)"
                                R"({"role":"assistant","content":"world"}]})" "\n");
  ds = vlm::data::load_dataset(files, dopt);
  auto c3 = vlm::data::dataset_text_token_counts(ds, *tok_, so, true, &st);
  EXPECT_EQ(st.computed, 1);
  EXPECT_EQ(st.cached, 2);
  EXPECT_EQ(c3[2].text_tokens,
            int64_t(enc(kSys + "<|im_start|>user\nhello hello<|im_end|>\n<|im_start|>assistant\n"
                        "world<|im_end|>\n").size()));
}

}  // namespace
