// Byte-level BPE backend on a small tokenizer.json built here (no network):
//  - BPE merging against an independent string-based reference implementation,
//  - Qwen pre-tokenizer regex splits worked out by hand from the pattern,
//  - added tokens (leftmost-longest), NFC, offsets, decode, config specials, errors,
//  - the `vlmtrain tokenize` command.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "tests/testing.h"
#include "tests/vlm/text/tokenizer_tiny_bpe.h"
#include "vlm/text/bpe_tokenizer.h"
#include "vlm/runtime/check.h"
#include "vlm/text/tokenizer.h"
#include "vlm/text/unicode.h"

namespace {

using nlohmann::json;
using namespace vlm::test;

class TinyBpe : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = make_tiny_model();
    tok_ = vlm::BpeTokenizer::from_json_text(model_.j.dump(), "tiny.json");
  }
  TinyModel model_;
  std::unique_ptr<vlm::BpeTokenizer> tok_;
};

TEST_F(TinyBpe, MergesMatchReferenceOnRandomStrings) {
  std::mt19937 rng(7);
  const std::string alphabet = "aaaabhelowrdtng \n";
  size_t checked = 0;
  for (int len : {1, 2, 3, 5, 8, 13, 40, 47, 48, 49, 64, 200, 1000}) {
    for (int rep = 0; rep < 30; ++rep) {
      std::string s;
      for (int i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
      ASSERT_EQ(tok_->bpe(s), reference_bpe(model_, s)) << "input: " << json(s).dump();
      ++checked;
    }
  }
  for (const std::string& s : std::vector<std::string>{"aaaa", "aaaaa", "aaaaaaaa", std::string(100, 'a'), std::string(101, 'a'),
                        std::string("abababababababababababababababababababababababababab")})
    EXPECT_EQ(tok_->bpe(s), reference_bpe(model_, s)) << s;
  EXPECT_GT(checked, 300u);
  // Known by construction: "hello" is one merged token, "aaaa" -> "aaaa".
  EXPECT_EQ(tok_->bpe("hello"), std::vector<int64_t>{model_.vocab.at("hello")});
  EXPECT_EQ(tok_->bpe("aaaa"), std::vector<int64_t>{model_.vocab.at("aaaa")});
}

TEST_F(TinyBpe, QwenPreTokenizerSplitsLikeTheRegexSays) {
  using V = std::vector<std::string>;
  EXPECT_EQ(tok_->pre_tokenize("Hello world's  \n\n 123"),
            (V{"Hello", " world", "'s", "  \n\n", " ", "1", "2", "3"}));
  EXPECT_EQ(tok_->pre_tokenize("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(tok_->pre_tokenize("x\t\ty "), (V{"x", "\t", "\ty", " "}));
  EXPECT_EQ(tok_->pre_tokenize("I'M they'RE we'll"), (V{"I", "'M", " they", "'RE", " we", "'ll"}));
  EXPECT_EQ(tok_->pre_tokenize("...!!\n\nok"), (V{"...!!\n\n", "ok"}));
  EXPECT_EQ(tok_->pre_tokenize("안녕 世界"), (V{"안녕", " 世界"}));
  EXPECT_EQ(tok_->pre_tokenize("$x"), (V{"$x"}));
  // U+3000 (ideographic space) is \s, and so is U+0085 in HF's (Oniguruma) \s.
  EXPECT_EQ(tok_->pre_tokenize("a\u3000\u3000b"), (V{"a", "\u3000", "\u3000b"}));
  EXPECT_EQ(tok_->pre_tokenize("a\u0085\u0085b"), (V{"a", "\u0085", "\u0085b"}));
  EXPECT_EQ(tok_->pre_tokenize(""), V{});
}

TEST_F(TinyBpe, Gpt2StyleByteLevelRegex) {
  // ByteLevel(use_regex = true) alone: GPT-2's pattern, case-sensitive contractions.
  json j = model_.j;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  auto gpt2 = vlm::BpeTokenizer::from_json_text(j.dump(), "gpt2.json");
  using V = std::vector<std::string>;
  EXPECT_EQ(gpt2->pre_tokenize("Hello world's  x"), (V{"Hello", " world", "'s", " ", " x"}));
  EXPECT_EQ(gpt2->pre_tokenize("I'M 2024!!"), (V{"I", "'", "M", " 2024", "!!"}));
  EXPECT_EQ(gpt2->decode(gpt2->encode("Hello world's  x")), "Hello world's  x");
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_THROW(vlm::BpeTokenizer::from_json_text(j.dump(), "gpt2.json"), vlm::Error);
}

TEST_F(TinyBpe, AddedTokensLongestMatchNfcOffsetsAndDecode) {
  const int64_t n = static_cast<int64_t>(model_.vocab.size());
  const int64_t eot = n, im_start = n + 1, im_end = n + 2, im_end_x = n + 3, think = n + 4;
  EXPECT_EQ(tok_->vocab_size(), n + 8);
  EXPECT_EQ(tok_->special_id("<|im_end|>"), im_end);
  EXPECT_TRUE(tok_->is_special(im_end));
  EXPECT_FALSE(tok_->is_special(think));

  // Leftmost-longest: "<|im_end|>x" beats "<|im_end|>".
  auto ids = tok_->encode("hello<|im_end|>x<|im_end|><think>");
  EXPECT_EQ(ids, (std::vector<int64_t>{model_.vocab.at("hello"), im_end_x, im_end, think}));
  // Text around specials is pre-tokenised separately: " hello" keeps its space.
  ids = tok_->encode("<|im_start|> hello<|endoftext|>");
  EXPECT_EQ(ids, (std::vector<int64_t>{im_start, model_.vocab.at(to_byte_level(" hello")), eot}));
  // An incomplete special is plain text.
  EXPECT_EQ(tok_->decode(tok_->encode("<|im_end")), "<|im_end");
  EXPECT_EQ(tok_->encode("<|im_end").size(), 8u);

  // NFC before BPE: decomposed and composed é give the same ids.
  EXPECT_EQ(tok_->encode("caf\u00e9"), tok_->encode("cafe\u0301"));
  EXPECT_EQ(tok_->decode(tok_->encode("cafe\u0301")), "caf\u00e9");

  // Offsets cover the input exactly.
  std::string text = "hello world<|im_end|>\n\n12 the";
  auto enc = tok_->encode_with_offsets(text);
  ASSERT_EQ(enc.ids.size(), enc.offsets.size());
  size_t at = 0;
  for (size_t k = 0; k < enc.ids.size(); ++k) {
    EXPECT_EQ(enc.offsets[k].first, at);
    std::string piece = text.substr(enc.offsets[k].first, enc.offsets[k].second - enc.offsets[k].first);
    EXPECT_EQ(tok_->decode({enc.ids[k]}), piece);
    at = enc.offsets[k].second;
  }
  EXPECT_EQ(at, text.size());

  // decode: skip_special, partial UTF-8 -> U+FFFD, bad ids -> error.
  EXPECT_EQ(tok_->decode(tok_->encode("<|im_start|>hello<think>"), true), "hello<think>");
  EXPECT_EQ(tok_->decode({0xE5}), "\xEF\xBF\xBD");  // lone lead byte of a 3-byte sequence
  EXPECT_THROW(tok_->decode({-1}), vlm::Error);
  EXPECT_THROW(tok_->decode({n + 8}), vlm::Error);
  EXPECT_THROW(tok_->encode(std::string("bad \xff utf8")), vlm::Error);
  EXPECT_EQ(tok_->id_to_token(model_.vocab.at(to_byte_level(" hello"))), "\u0120hello");
  EXPECT_EQ(tok_->token_to_id("\u0120hello").value(), model_.vocab.at(to_byte_level(" hello")));
  EXPECT_FALSE(tok_->token_to_id("nope").has_value());
}

TEST_F(TinyBpe, RoundTripOnRandomUnicode) {
  std::mt19937 rng(11);
  const std::vector<std::string> parts = {"hello", " ", "  ", "\t", "\r\n", "안녕", "世界", "😀",
                                          "👨‍👩‍👧", "e\u0301", "<|im_end|>", "<|im_", "12345",
                                          "'s", "'LL", "!?", "\u00a0", "\u3000", "x"};
  for (int i = 0; i < 500; ++i) {
    std::string s;
    for (int k = rng() % 10; k >= 0; --k) s += parts[rng() % parts.size()];
    EXPECT_EQ(tok_->decode(tok_->encode(s)), vlm::unicode::nfc_hf(s)) << json(s).dump();
  }
}

TEST_F(TinyBpe, ConcurrentEncodeEqualsSequential) {
  // Loader worker threads share one tokenizer (and its pre-token cache).
  std::mt19937 rng(5);
  const std::vector<std::string> parts = {"hello", " world", " the", "abab", "aaaa", "12", "  ",
                                          "\n\n", "안녕", "<|im_end|>", "x"};
  std::vector<std::string> texts(400);
  for (auto& t : texts)
    for (int k = rng() % 20; k >= 0; --k) t += parts[rng() % parts.size()];
  std::vector<std::vector<int64_t>> expected;
  {
    auto fresh = vlm::BpeTokenizer::from_json_text(model_.j.dump(), "fresh.json");
    for (const auto& t : texts) expected.push_back(fresh->encode(t));
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 5; ++rep)
        for (size_t i = (w * 37) % texts.size(), n = 0; n < texts.size(); ++n, i = (i + 1) % texts.size())
          mismatches[w] += tok_->encode(texts[i]) != expected[i];
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(TokenizerLoad, ConfigSpecialsAndErrors) {
  vlm::test::TempDir dir("bpe_load");
  TinyModel m = make_tiny_model(/*with_vision=*/false);
  vlm::test::write_file(dir / "tokenizer.json", m.j.dump());
  auto tok = vlm::load_tokenizer(dir.path());
  EXPECT_EQ(tok->kind(), "bpe");
  // Without a config: Qwen-Instruct defaults.
  EXPECT_EQ(tok->specials().eos, tok->special_id("<|im_end|>"));
  EXPECT_EQ(tok->specials().pad, tok->special_id("<|endoftext|>"));
  vlm::test::write_file(dir / "tokenizer_config.json",
                      R"({"eos_token": "<|endoftext|>", "pad_token": {"content": "<|im_start|>"},
                          "bos_token": null})");
  tok = vlm::load_tokenizer(dir / "tokenizer.json");
  EXPECT_EQ(tok->specials().eos, tok->special_id("<|endoftext|>"));
  EXPECT_EQ(tok->specials().pad, tok->special_id("<|im_start|>"));
  EXPECT_FALSE(tok->specials().bos.has_value());
  // A config naming a token the tokenizer lacks is an error that names it.
  vlm::test::write_file(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  try {
    vlm::load_tokenizer(dir.path());
    FAIL() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("</s>"), std::string::npos) << e.what();
  }
  // Missing special by name.
  try {
    tok->special_id("<|image_pad|>", "image items");
    FAIL() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("<|image_pad|>"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("image items"), std::string::npos);
  }
  // Unsupported features are rejected, not ignored.
  json bad = m.j;
  bad["model"]["byte_fallback"] = true;
  EXPECT_THROW(vlm::BpeTokenizer::from_json_text(bad.dump(), "bad.json"), vlm::Error);
  bad = m.j;
  bad["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_THROW(vlm::BpeTokenizer::from_json_text(bad.dump(), "bad.json"), vlm::Error);
  bad = m.j;
  bad["added_tokens"][0]["lstrip"] = true;
  EXPECT_THROW(vlm::BpeTokenizer::from_json_text(bad.dump(), "bad.json"), vlm::Error);
  EXPECT_THROW(vlm::load_tokenizer(dir / "missing"), vlm::Error);
}

// Regression tests from tests/fuzz/tokenizer_json_fuzz.cpp: a tokenizer.json from a stranger
// may only be rejected with a vlm::Error naming the file, never crash or leak another
// exception type.
void expect_rejected(const json& j, const std::string& needle) {
  try {
    vlm::BpeTokenizer::from_json_text(j.dump(), "fuzzed/tokenizer.json");
    FAIL() << "expected a vlm::Error for " << j.dump().substr(0, 200);
  } catch (const vlm::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("fuzzed/tokenizer.json"), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

TEST(TokenizerJson, RejectsWrongStructureWithVlmError) {
  const json good = make_tiny_model(/*with_vision=*/false).j;
  json bad = good;
  bad["added_tokens"][0].erase("content");  // was: nlohmann out_of_range escaping the loader
  expect_rejected(bad, "content");
  bad = good;
  bad["model"]["merges"] = json::array({42});
  expect_rejected(bad, "merge #0");
  bad = good;
  bad["model"]["merges"] = json::array({json::array({1, 2})});
  expect_rejected(bad, "unexpected tokenizer.json structure");
  bad = good;
  bad["normalizer"] = {{"type", "Sequence"}, {"normalizers", 7}};
  expect_rejected(bad, "unexpected tokenizer.json structure");
  bad = good;
  bad["pre_tokenizer"]["pretokenizers"][0]["pattern"] = json::object();
  expect_rejected(bad, "unexpected tokenizer.json structure");
  bad = good;
  bad["model"]["vocab"]["a"] = "7";
  expect_rejected(bad, "\"a\"");
}

TEST(TokenizerJson, RejectsNegativeAndHugeTokenIds) {
  const json good = make_tiny_model(/*with_vision=*/false).j;
  json bad = good;
  bad["model"]["vocab"]["zz"] = -1;  // was: a write before the start of the id table
  expect_rejected(bad, "\"zz\" has id -1");
  bad = good;
  bad["added_tokens"][0]["id"] = -3;
  expect_rejected(bad, "has id -3");
  bad = good;
  bad["model"]["vocab"]["zz"] = int64_t(2147483646);  // was: tables of 2^31 entries (OOM)
  expect_rejected(bad, "has id 2147483646");
  bad = good;
  bad["added_tokens"][0]["id"] = vlm::kMaxVocabSize;
  expect_rejected(bad, std::to_string(vlm::kMaxVocabSize));
}

TEST(TokenizeCommand, IdsTokensAndDecode) {
  vlm::test::TempDir dir("bpe_cli");
  TinyModel m = make_tiny_model();
  vlm::test::write_file(dir / "tokenizer.json", m.j.dump());
  const std::string bin = vlm::test::vlmtrain_bin();
  auto r = vlm::test::run({bin, "tokenize", "--tokenizer", dir / "tokenizer.json", "hello world",
                         "<|im_end|>world"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int64_t n = static_cast<int64_t>(m.vocab.size());
  std::string expect = std::to_string(m.vocab.at("hello")) + " " + std::to_string(m.vocab.at(to_byte_level(" world"))) +
                       "\n" + std::to_string(n + 2) + " " + std::to_string(m.vocab.at("world")) + "\n";
  EXPECT_EQ(r.output, expect);
  r = vlm::test::run({bin, "tokenize", "--tokens", "--tokenizer", dir / "tokenizer.json", "--",
                    "hello world"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "hello \u0120world\n");
  r = vlm::test::run({bin, "tokenize", "--decode", "--tokenizer", dir / "tokenizer.json", "--",
                    std::to_string(m.vocab.at("hello")) + " " + std::to_string(m.vocab.at(to_byte_level(" world"))),
                    std::to_string(n + 2) + "," + std::to_string(m.vocab.at("world"))});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "hello world\n<|im_end|>world\n");
  r = vlm::test::run({bin, "tokenize", "--tokenizer", dir / "nope.json", "x"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("nope.json"), std::string::npos) << r.output;
}

}  // namespace
