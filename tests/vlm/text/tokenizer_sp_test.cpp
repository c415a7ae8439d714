// SentencePiece backend: a model trained here with the trainer API (through
// vlm::train_sentencepiece, flags from vlm::sp_trainer_flags()) must give the same ids as
// the `spm_encode` CLI, round-trip text exactly, and recognise the chat specials.
// Also checks that the binary that uses it starts (libsentencepiece's bundled protobuf
// crashes a process that links it next to LibTorch's libprotobuf).
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <sstream>

#include "tests/require_sentencepiece.h"
#include "tests/testing.h"
#include "vlm/text/chat_template.h"
#include "vlm/runtime/check.h"
#include "vlm/text/sp_tokenizer.h"
#include "vlm/text/tokenizer.h"

namespace {

std::vector<std::string> sample_lines(size_t n, uint32_t seed) {
  const std::vector<std::string> words = {
      "the", "quick", "brown", "fox", "invoice", "total", "amount", "date", "OCR", "text",
      "안녕하세요", "세계", "光学", "识别", "こんにちは", "2024", "12.50", "€", "(a)", "[b]",
      "e-mail:", "x@y.z", "don't", "Hello,", "world!", "\t", "  "};
  std::mt19937 rng(seed);
  std::vector<std::string> lines;
  for (size_t i = 0; i < n; ++i) {
    std::string s;
    for (int k = 1 + rng() % 12; k > 0; --k) {
      if (!s.empty()) s += ' ';
      s += words[rng() % words.size()];
    }
    lines.push_back(s);
  }
  return lines;
}

class SpModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!vlm::sentencepiece_available()) return;  // every test skips (SetUp)
    dir_ = new vlm::test::TempDir("sp_model");
    std::string corpus;
    for (const auto& l : sample_lines(3000, 1)) corpus += l + "\n";
    vlm::test::write_file((*dir_) / "train.txt", corpus);
    std::string args = "--input=" + (*dir_) / "train.txt" + " --model_prefix=" + (*dir_) / "tiny" +
                       " --vocab_size=400 --model_type=bpe --character_coverage=1.0"
                       " --hard_vocab_limit=false --minloglevel=2 " + vlm::sp_trainer_flags();
    vlm::train_sentencepiece(args);
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override { VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE(); }
  static std::string model() { return (*dir_) / "tiny.model"; }
  static vlm::test::TempDir* dir_;
};
vlm::test::TempDir* SpModel::dir_ = nullptr;

// Where the backend cannot run (ASan builds), loading or training says so clearly instead
// of letting ASan abort the process on dlopen(RTLD_DEEPBIND).
TEST(SentencePiece, UnavailableBackendIsAClearError) {
  std::string why;
  if (vlm::sentencepiece_available(&why)) GTEST_SKIP() << "the backend is available in this build";
  EXPECT_NE(why.find("AddressSanitizer"), std::string::npos) << why;
  vlm::test::TempDir dir("sp_unavailable");
  vlm::test::write_file(dir / "x.model", "not a model");
  for (const auto& attempt : std::vector<std::function<void()>>{
           [&] { vlm::SentencePieceTokenizer::load(dir / "x.model"); },
           [&] { vlm::load_tokenizer(dir / "x.model"); },
           [&] { vlm::train_sentencepiece("--input=" + dir / "x.model"); }}) {
    try {
      attempt();
      FAIL() << "expected a vlm::Error";
    } catch (const vlm::Error& e) {
      EXPECT_NE(std::string(e.what()).find("RTLD_DEEPBIND"), std::string::npos) << e.what();
    }
  }
}

TEST_F(SpModel, IdsMatchSpmEncode) {
  auto tok = vlm::load_tokenizer(model());
  EXPECT_EQ(tok->kind(), "sentencepiece");
  vlm::test::TempDir dir("sp_cli");
  auto lines = sample_lines(300, 2);
  lines.push_back("<|im_start|>user<|im_end|> mixed <|image_pad|><|image_pad|>");
  lines.push_back("unseen: Ωμέγα ✨ 🤖 ÿ");
  std::string in;
  for (const auto& l : lines) in += l + "\n";
  vlm::test::write_file(dir / "in.txt", in);
  auto r = vlm::test::run({"spm_encode", "--model=" + model(), "--output_format=id",
                         "--input=" + dir / "in.txt", "--output=" + dir / "out.txt"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream out(vlm::test::read_file(dir / "out.txt"));
  std::string line;
  size_t i = 0, same = 0;
  while (std::getline(out, line)) {
    ASSERT_LT(i, lines.size());
    std::vector<int64_t> ref;
    std::istringstream ss(line);
    for (int64_t id; ss >> id;) ref.push_back(id);
    auto ids = tok->encode(lines[i]);
    EXPECT_EQ(ids, ref) << "line " << i << ": " << lines[i];
    same += ids == ref;
    ++i;
  }
  EXPECT_EQ(i, lines.size());
  EXPECT_EQ(same, lines.size());
}

TEST_F(SpModel, RoundTripsAndSpecials) {
  auto tok = vlm::load_tokenizer(dir_->path());  // directory holding one .model
  for (const auto& s : sample_lines(200, 3)) EXPECT_EQ(tok->decode(tok->encode(s)), s);
  for (std::string s : {"line one\nline two\r\n\ttabbed  double  space ", "  leading", "ÿ 🤖 Ωμέγα",
                        "<|im_start|>assistant\nHi<|im_end|>\n"})
    EXPECT_EQ(tok->decode(tok->encode(s)), s) << s;
  // Every chat special is one piece of its own, with the ChatML roles.
  for (const auto& name : vlm::chat_special_tokens()) {
    int64_t id = tok->special_id(name);
    EXPECT_TRUE(tok->is_special(id)) << name;
    EXPECT_EQ(tok->id_to_token(id), name);
    EXPECT_EQ(tok->encode("a" + name + "b").size(), 3u) << name;
  }
  EXPECT_EQ(tok->specials().eos, tok->special_id("<|im_end|>"));
  EXPECT_EQ(tok->specials().pad, tok->special_id("<|endoftext|>"));
  EXPECT_FALSE(tok->specials().bos.has_value());
  EXPECT_EQ(tok->decode(tok->encode("<|im_start|>x<|im_end|>"), true), "x");
  // Offsets: each token's bytes are the input's.
  std::string text = "Hello, world! 2024";
  auto enc = tok->encode_with_offsets(text);
  size_t at = 0;
  for (size_t k = 0; k < enc.ids.size(); ++k) {
    EXPECT_EQ(enc.offsets[k].first, at);
    at = enc.offsets[k].second;
  }
  EXPECT_EQ(at, text.size());
  EXPECT_THROW(tok->decode({tok->vocab_size()}), vlm::Error);
  EXPECT_THROW(vlm::load_tokenizer((*dir_) / "train.txt"), vlm::Error);
  EXPECT_THROW(vlm::train_sentencepiece("--input=/nonexistent --model_prefix=/tmp/x"), vlm::Error);
}

TEST_F(SpModel, ChatTemplateWorksWithSentencePiece) {
  auto tok = vlm::load_tokenizer(model());
  using vlm::ChatItem;
  std::vector<vlm::ChatTurn> chat = {
      {"user", {ChatItem::Image(), ChatItem::Text("Read the text.")}},
      {"assistant", {ChatItem::Text("invoice total 12.50 €")}},
      {"user", {ChatItem::Text("and the date?")}},
      {"assistant", {ChatItem::Text("2024")}}};
  auto r = vlm::render_chat(*tok, chat, {6});
  // Independent expectation: the rendered text with the pad expanded, encoded whole.
  std::string text = vlm::render_chat_text(chat);
  const std::string pad = "<|image_pad|>";
  std::string expanded = text;
  expanded.replace(expanded.find(pad), pad.size(), pad + pad + pad + pad + pad + pad);
  EXPECT_EQ(r.input_ids, tok->encode(expanded));
  ASSERT_EQ(r.image_spans.size(), 1u);
  EXPECT_EQ(r.image_spans[0].length, 6);
  // Supervised runs decode to exactly the answers with <|im_end|>\n.
  std::vector<std::string> runs;
  for (size_t i = 0; i < r.labels.size(); ++i) {
    if (r.labels[i] == vlm::kIgnoreIndex) continue;
    std::vector<int64_t> run;
    for (; i < r.labels.size() && r.labels[i] != vlm::kIgnoreIndex; ++i) run.push_back(r.labels[i]);
    runs.push_back(tok->decode(run));
  }
  EXPECT_EQ(runs, (std::vector<std::string>{"invoice total 12.50 €<|im_end|>\n", "2024<|im_end|>\n"}));
}

TEST_F(SpModel, TokenizeCommandWithSentencePiece) {
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "tokenize", "--tokenizer", model(), "--",
                         "Hello, world!<|im_end|>"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto tok = vlm::load_tokenizer(model());
  std::string expect;
  for (int64_t id : tok->encode("Hello, world!<|im_end|>"))
    expect += (expect.empty() ? "" : " ") + std::to_string(id);
  EXPECT_EQ(r.output, expect + "\n");
}

}  // namespace
