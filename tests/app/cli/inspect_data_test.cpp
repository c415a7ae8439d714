// `vlmtrain inspect data`: the binary scans a tiny dataset written here (images rendered
// with OpenCV, a sentencepiece tokenizer trained here) and its JSON numbers must equal
// values computed independently in the test: image tokens from vlm::smart_resize, text
// lengths from encoding the expected ChatML text (pads expanded) in one call.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include <algorithm>
#include <map>
#include <random>

#include "tests/require_sentencepiece.h"
#include "tests/testing.h"
#include "vlm/model/image_geometry.h"
#include "vlm/text/sp_tokenizer.h"
#include "vlm/text/tokenizer.h"

namespace {

using nlohmann::json;

using vlm::test::last_json_line;

std::string pads(int64_t n) {
  std::string s = "<|vision_start|>";
  for (int64_t i = 0; i < n; ++i) s += "<|image_pad|>";
  return s + "<|vision_end|>";
}

int64_t bucket(int64_t v) {  // smallest power of two >= v (help text's rule)
  int64_t b = 1;
  while (b < v) b <<= 1;
  return v <= 0 ? 0 : b;
}

// A small unigram sentencepiece tokenizer with the ChatML specials, as d/tok.model.
std::unique_ptr<vlm::Tokenizer> train_inspect_tokenizer(const std::string& d) {
  std::string corpus;
  std::mt19937 rng(5);
  const std::vector<std::string> words = {"hello", "world", "invoice", "total", "12.50", "read",
                                          "the", "text", "in", "image", "Read"};
  for (int i = 0; i < 1500; ++i) {
    std::string l;
    for (int k = 1 + int(rng() % 6); k > 0; --k) l += (l.empty() ? "" : " ") + words[rng() % words.size()];
    corpus += l + "\n";
  }
  vlm::test::write_file(d + "/corpus.txt", corpus);
  vlm::train_sentencepiece("--input=" + d + "/corpus.txt --model_prefix=" + d + "/tok" +
                           " --vocab_size=320 --model_type=unigram --character_coverage=1.0"
                           " --hard_vocab_limit=false --num_threads=1 " + vlm::sp_trainer_flags());
  return vlm::load_tokenizer(d + "/tok.model");
}

TEST(InspectData, JsonMatchesIndependentCounts) {
  VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE();
  vlm::test::TempDir dir("inspect_data");
  const std::string d = dir.path();
  auto tok = train_inspect_tokenizer(d);

  // Images: (h, w).
  const std::vector<std::pair<int, int>> sizes = {{56, 84}, {112, 112}, {30, 400}};
  for (size_t i = 0; i < sizes.size(); ++i)
    ASSERT_TRUE(cv::imwrite(d + "/i" + std::to_string(i) + ".png",
                            cv::Mat(sizes[i].first, sizes[i].second, CV_8UC3, cv::Scalar(200, 200, 200))));
  vlm::test::write_file(d + "/train.jsonl",
                      R"({"image":"i0.png","text":"hello world"})" "\n"
                      R"({"image":"i1.png","text":"invoice total 12.50 hello world invoice"})" "\n"
                      R"({"image":"gone.png","text":"x"})" "\n"
                      "not json\n"
                      R"({"image":"i2.png","text":"read"})" "\n");
  vlm::test::write_file(d + "/eval.jsonl",
                      R"({"messages":[{"role":"user","content":"hello"},{"role":"assistant","content":"world"}]})" "\n"
                      R"({"messages":[{"role":"user","content":"<image><image>read"},{"role":"assistant","content":"total"}],"images":["i0.png","i1.png"]})" "\n");
  const int64_t cap = 8;
  vlm::test::write_file(d + "/r.toml", "[model]\ntokenizer = \"" + d + "/tok.model\"\n[data]\n"
                      "train = [\"" + d + "/train.jsonl\"]\neval = [\"" + d + "/eval.jsonl\"]\n"
                      "prompt = \"Read the text.\"\nmax_image_tokens = " + std::to_string(cap) + "\n");

  // Independent expectations.
  const vlm::PixelLimits raw_lim{3136, 12845056}, cap_lim{3136, cap * 784};
  auto tokens = [&](size_t i, const vlm::PixelLimits& l) {
    auto s = vlm::smart_resize(sizes[i].first, sizes[i].second, l);
    return (s.height / 28) * (s.width / 28);
  };
  const std::string sys = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";
  auto len = [&](const std::string& text) { return int64_t(tok->encode(text).size()); };
  auto plain = [&](int64_t n, const std::string& answer) {
    return sys + "<|im_start|>user\n" + pads(n) + "Read the text.<|im_end|>\n<|im_start|>assistant\n" +
           answer + "<|im_end|>\n";
  };
  const std::vector<int64_t> train_seq = {len(plain(tokens(0, cap_lim), "hello world")),
                                          len(plain(tokens(1, cap_lim), "invoice total 12.50 hello world invoice")),
                                          len(plain(tokens(2, cap_lim), "read"))};
  const std::vector<int64_t> train_sup = {len("hello world<|im_end|>\n"),
                                          len("invoice total 12.50 hello world invoice<|im_end|>\n"),
                                          len("read<|im_end|>\n")};
  // Between the shortest and the longest sample: some, not all, are over.
  const int64_t max_seq = *std::min_element(train_seq.begin(), train_seq.end());
  ASSERT_LT(max_seq, *std::max_element(train_seq.begin(), train_seq.end()));

  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "data", d + "/r.toml", "--json", "--set",
                         "data.max_seq_len=" + std::to_string(max_seq)});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = last_json_line(r.output);
  EXPECT_EQ(j["max_image_tokens"], cap);
  EXPECT_EQ(j["max_seq_len"], max_seq);
  const json& t = j["splits"]["train"];
  EXPECT_EQ(t["lines"], 5);
  EXPECT_EQ(t["records"], 3);
  EXPECT_EQ(t["bad"], 2);
  EXPECT_EQ(t["bad_by_reason"], json({{"invalid json", 1}, {"missing image", 1}}));
  EXPECT_EQ(t["images"], 3);
  EXPECT_EQ(t["image_width"]["max"], 400);
  EXPECT_EQ(t["image_height"]["min"], 30);
  int64_t raw_sum = 0, cap_sum = 0, over = 0;
  std::map<int64_t, int64_t> cap_hist;
  for (size_t i = 0; i < 3; ++i) {
    raw_sum += tokens(i, raw_lim);
    cap_sum += tokens(i, cap_lim);
    over += tokens(i, raw_lim) > cap;
    ++cap_hist[bucket(tokens(i, cap_lim))];
  }
  ASSERT_GT(over, 0) << "the 112x112 image (16 tokens) is over the cap";
  EXPECT_EQ(t["image_tokens_uncapped"]["sum"], raw_sum);
  EXPECT_EQ(t["image_tokens_capped"]["sum"], cap_sum);
  EXPECT_EQ(t["images_over_cap"], over);
  json hist = json::array();
  for (auto& [b, n] : cap_hist) hist.push_back({b, n});
  EXPECT_EQ(t["image_tokens_capped"]["histogram"], hist);

  int64_t seq_sum = 0, sup_sum = 0, over_len = 0;
  std::map<int64_t, int64_t> seq_hist;
  for (size_t i = 0; i < 3; ++i) {
    seq_sum += train_seq[i];
    sup_sum += train_sup[i];
    over_len += train_seq[i] > max_seq;
    ++seq_hist[bucket(train_seq[i])];
  }
  EXPECT_EQ(t["seq_len"]["sum"], seq_sum);
  EXPECT_EQ(t["seq_len"]["max"], *std::max_element(train_seq.begin(), train_seq.end()));
  EXPECT_EQ(t["supervised_tokens"]["sum"], sup_sum);
  EXPECT_EQ(t["over_max_seq_len"], over_len);
  EXPECT_GT(over_len, 0);
  EXPECT_LT(over_len, 3);
  hist = json::array();
  for (auto& [b, n] : seq_hist) hist.push_back({b, n});
  EXPECT_EQ(t["seq_len"]["histogram"], hist);
  EXPECT_EQ(t["text_tokens"]["sum"], seq_sum - cap_sum);

  const json& e = j["splits"]["eval"];
  EXPECT_EQ(e["records"], 2);
  EXPECT_EQ(e["text_only_records"], 1);
  const int64_t e0 = len(sys + "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nworld<|im_end|>\n");
  const int64_t e1 = len(sys + "<|im_start|>user\n" + pads(tokens(0, cap_lim)) + pads(tokens(1, cap_lim)) +
                         "read<|im_end|>\n<|im_start|>assistant\ntotal<|im_end|>\n");
  EXPECT_EQ(e["seq_len"]["sum"], e0 + e1);
  EXPECT_EQ(e["seq_len"]["min"], std::min(e0, e1));
  EXPECT_EQ(e["supervised_tokens"]["sum"], len("world<|im_end|>\n") + len("total<|im_end|>\n"));

  // Second run: the text token counts come from the index cache, same numbers.
  auto r2 = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "data", d + "/r.toml", "--json", "--set",
                          "data.max_seq_len=" + std::to_string(max_seq)});
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  const json j2 = last_json_line(r2.output);
  EXPECT_EQ(j2["splits"]["train"]["token_counts_cached"], 3);
  EXPECT_EQ(j2["splits"]["train"]["seq_len"], t["seq_len"]);

  // Human-readable output names the numbers.
  auto r3 = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "data", d + "/r.toml"});
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  EXPECT_NE(r3.output.find("train: 3 records from 5 lines, 2 bad"), std::string::npos) << r3.output;
  EXPECT_NE(r3.output.find("bad: missing image: 1"), std::string::npos) << r3.output;
  EXPECT_NE(r3.output.find("images over the cap of 8 tokens: " + std::to_string(over)),
            std::string::npos) << r3.output;
}

// With a Qwen3-VL model (preset qwen3-vl-2b): image tokens at resize factor 32 under its
// pixel defaults (65536 .. 16777216) and the cap, and no system turn in the text.
TEST(InspectData, Qwen3PresetUsesItsFactorAndNoSystemTurn) {
  VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE();
  vlm::test::TempDir dir("inspect_data_q3");
  const std::string d = dir.path();
  auto tok = train_inspect_tokenizer(d);
  const std::vector<std::pair<int, int>> sizes = {{56, 84}, {480, 640}};
  for (size_t i = 0; i < sizes.size(); ++i)
    ASSERT_TRUE(cv::imwrite(d + "/i" + std::to_string(i) + ".png",
                            cv::Mat(sizes[i].first, sizes[i].second, CV_8UC3, cv::Scalar(90, 90, 90))));
  vlm::test::write_file(d + "/train.jsonl", R"({"image":"i0.png","text":"hello world"})" "\n"
                                          R"({"image":"i1.png","text":"read"})" "\n");
  const int64_t cap = 100;
  vlm::test::write_file(d + "/r.toml", "[model]\npreset = \"qwen3-vl-2b\"\ntokenizer = \"" + d +
                      "/tok.model\"\n[data]\ntrain = [\"" + d + "/train.jsonl\"]\n"
                      "prompt = \"Read the text.\"\nmax_image_tokens = " + std::to_string(cap) + "\n");
  const vlm::PixelLimits cap_lim{65536, cap * 32 * 32};
  auto tokens = [&](size_t i) {
    auto s = vlm::smart_resize(sizes[i].first, sizes[i].second, cap_lim, 32);
    EXPECT_EQ(s.height % 32, 0);
    return (s.height / 32) * (s.width / 32);
  };
  auto len = [&](const std::string& text) { return int64_t(tok->encode(text).size()); };
  auto text = [&](int64_t n, const std::string& answer) {  // no system turn
    return "<|im_start|>user\n" + pads(n) + "Read the text.<|im_end|>\n<|im_start|>assistant\n" +
           answer + "<|im_end|>\n";
  };
  const int64_t seq0 = len(text(tokens(0), "hello world")), seq1 = len(text(tokens(1), "read"));
  EXPECT_EQ(tokens(0), 70);  // 56 x 84 scaled up to min_pixels: 224 x 320
  EXPECT_LE(tokens(1), cap);

  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "data", d + "/r.toml", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = last_json_line(r.output);
  EXPECT_EQ(j["factor"], 32);
  EXPECT_EQ(j["min_pixels"], 65536);
  EXPECT_EQ(j["max_pixels"], 16777216);
  const json& t = j["splits"]["train"];
  EXPECT_EQ(t["records"], 2);
  EXPECT_EQ(t["image_tokens_capped"]["sum"], tokens(0) + tokens(1));
  EXPECT_EQ(t["seq_len"]["sum"], seq0 + seq1);
  EXPECT_EQ(t["supervised_tokens"]["sum"], len("hello world<|im_end|>\n") + len("read<|im_end|>\n"));
  // The same data under Qwen2-VL (preset tiny) counts differently: factor 28, a system turn.
  auto r2 = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "data", d + "/r.toml", "--json", "--set",
                          "model.preset=tiny"});
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  const json j2 = last_json_line(r2.output);
  EXPECT_EQ(j2["factor"], 28);
  const int64_t sys = len("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
  EXPECT_EQ(j2["splits"]["train"]["text_tokens"]["sum"].get<int64_t>(),
            t["text_tokens"]["sum"].get<int64_t>() + 2 * sys);
}

TEST(InspectData, Errors) {
  vlm::test::TempDir dir("inspect_data");
  vlm::test::write_file(dir / "r.toml", "[data]\n");
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "data", dir / "r.toml"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("data.train"), std::string::npos) << r.output;
  r = vlm::test::run({vlm::test::vlmtrain_bin(), "inspect", "data", dir / "r.toml", "--set",
                    "data.train=" + dir / "missing.jsonl"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("missing.jsonl"), std::string::npos) << r.output;
}

}  // namespace
