// ChatML rendering and label masks on the offline tiny BPE tokenizer. The expected
// sequence of each case is built independently, piece by piece, from the template in
// shared/spec/qwen2_vl.md section 3 (specials by id, text pieces encoded separately),
// with labels = ids on "answer<|im_end|>\n" of assistant turns and -100 elsewhere.
#include <gtest/gtest.h>

#include "tests/testing.h"
#include "tests/vlm/tokenizer_tiny_bpe.h"
#include "vlm/bpe_tokenizer.h"
#include "vlm/chat_template.h"
#include "vlm/check.h"

namespace {

using vlm::ChatItem;
using vlm::ChatTurn;
using vlm::kIgnoreIndex;

class ChatTemplate : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = vlm::BpeTokenizer::from_json_text(vlmtest::make_tiny_model().j.dump(), "tiny.json");
  }
  int64_t id(const char* name) { return tok_->special_id(name); }

  // Expected sequence builder.
  struct Expect {
    std::vector<int64_t> ids, labels;
    std::vector<vlm::ImageSpan> spans;
  };
  void text(Expect& x, const std::string& s, bool sup = false) {
    for (int64_t t : tok_->encode(s)) {
      x.ids.push_back(t);
      x.labels.push_back(sup ? t : kIgnoreIndex);
    }
  }
  void special(Expect& x, const char* name, bool sup = false) {
    x.ids.push_back(id(name));
    x.labels.push_back(sup ? id(name) : kIgnoreIndex);
  }
  void image(Expect& x, int64_t n) {
    special(x, "<|vision_start|>");
    x.spans.push_back({static_cast<int64_t>(x.ids.size()), n});
    for (int64_t k = 0; k < n; ++k) special(x, "<|image_pad|>");
    special(x, "<|vision_end|>");
  }
  void header(Expect& x, const std::string& role) {
    special(x, "<|im_start|>");
    text(x, role + "\n");
  }
  void end(Expect& x, bool sup = false) {
    special(x, "<|im_end|>", sup);
    text(x, "\n", sup);
  }
  void default_system(Expect& x) {
    header(x, "system");
    text(x, "You are a helpful assistant.");
    end(x);
  }
  void check(const vlm::RenderedChat& r, const Expect& x) {
    EXPECT_EQ(r.input_ids, x.ids);
    EXPECT_EQ(r.labels, x.labels);
    ASSERT_EQ(r.image_spans.size(), x.spans.size());
    for (size_t i = 0; i < x.spans.size(); ++i) {
      EXPECT_EQ(r.image_spans[i].begin, x.spans[i].begin);
      EXPECT_EQ(r.image_spans[i].length, x.spans[i].length);
    }
  }
  // Supervised positions as [begin, end) runs.
  static std::vector<std::pair<size_t, size_t>> runs(const std::vector<int64_t>& labels) {
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t i = 0; i < labels.size(); ++i) {
      if (labels[i] == kIgnoreIndex) continue;
      if (!out.empty() && out.back().second == i)
        out.back().second = i + 1;
      else
        out.emplace_back(i, i + 1);
    }
    return out;
  }
  std::unique_ptr<vlm::BpeTokenizer> tok_;
};

TEST_F(ChatTemplate, SingleTurnWithImage) {
  std::vector<ChatTurn> chat = {
      {"user", {ChatItem::Image(), ChatItem::Text("Read the text.")}},
      {"assistant", {ChatItem::Text("hello world")}}};
  const int64_t n = vlm::merged_image_tokens(1, 4, 6);  // 6
  EXPECT_EQ(n, 6);
  Expect x;
  default_system(x);
  header(x, "user");
  image(x, n);
  text(x, "Read the text.");
  end(x);
  header(x, "assistant");
  const size_t answer_at = x.ids.size();
  text(x, "hello world", true);
  end(x, true);
  auto r = vlm::render_chat(*tok_, chat, {n});
  check(r, x);
  // Exactly one supervised run: "hello world<|im_end|>\n", ending the sequence.
  auto sup = runs(r.labels);
  ASSERT_EQ(sup.size(), 1u);
  EXPECT_EQ(sup[0].first, answer_at);
  EXPECT_EQ(sup[0].second, r.labels.size());
  EXPECT_EQ(tok_->decode(std::vector<int64_t>(r.input_ids.begin() + sup[0].first, r.input_ids.end())),
            "hello world<|im_end|>\n");
}

TEST_F(ChatTemplate, MultiTurnMultiImageWithSystemPrompt) {
  std::vector<ChatTurn> chat = {
      {"system", {ChatItem::Text("the OCR")}},
      {"user", {ChatItem::Text("first "), ChatItem::Image(), ChatItem::Text(" second"),
                ChatItem::Image()}},
      {"assistant", {ChatItem::Text("abab")}},
      {"user", {ChatItem::Text("and "), ChatItem::Text("the third?"), ChatItem::Image()}},
      {"assistant", {ChatItem::Text(" 12 hello\n\n")}}};
  std::vector<int64_t> counts = {vlm::merged_image_tokens(1, 2, 2), vlm::merged_image_tokens(1, 4, 8),
                                 vlm::merged_image_tokens(2, 2, 4)};
  Expect x;
  header(x, "system");  // no default system: turn 0 is a system turn
  text(x, "the OCR");
  end(x);
  header(x, "user");
  text(x, "first ");
  image(x, counts[0]);
  text(x, " second");
  image(x, counts[1]);
  end(x);
  header(x, "assistant");
  text(x, "abab", true);
  end(x, true);
  header(x, "user");
  text(x, "and the third?");
  image(x, counts[2]);
  end(x);
  header(x, "assistant");
  text(x, " 12 hello\n\n", true);
  end(x, true);
  auto r = vlm::render_chat(*tok_, chat, counts);
  check(r, x);
  EXPECT_EQ(runs(r.labels).size(), 2u);
}

TEST_F(ChatTemplate, NoImageGenerationPromptAndUnsupervised) {
  std::vector<ChatTurn> chat = {{"user", {ChatItem::Text("hello")}}};
  vlm::ChatOptions opt;
  opt.add_generation_prompt = true;
  Expect x;
  default_system(x);
  header(x, "user");
  text(x, "hello");
  end(x);
  header(x, "assistant");
  auto r = vlm::render_chat(*tok_, chat, {}, opt);
  check(r, x);
  EXPECT_TRUE(runs(r.labels).empty());
  EXPECT_EQ(vlm::render_chat_text(chat, opt),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n");
  // supervise_assistant = false and an empty default system.
  std::vector<ChatTurn> qa = {{"user", {ChatItem::Text("q")}}, {"assistant", {ChatItem::Text("a")}}};
  vlm::ChatOptions quiet;
  quiet.supervise_assistant = false;
  quiet.default_system = "";
  auto q = vlm::render_chat(*tok_, qa, {}, quiet);
  EXPECT_TRUE(runs(q.labels).empty());
  EXPECT_EQ(q.input_ids[0], id("<|im_start|>"));
  EXPECT_EQ(tok_->decode(q.input_ids), "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n");
}

TEST_F(ChatTemplate, AnswerStartingWithNewlineAndNfc) {
  // "assistant\n" + "\nhello": the two newlines form one token "\n\n" that straddles the
  // answer start, so it is not supervised; the rest of the answer is.
  std::vector<ChatTurn> chat = {{"user", {ChatItem::Text("cafe\u0301")}},
                                {"assistant", {ChatItem::Text("\nhello")}}};
  auto r = vlm::render_chat(*tok_, chat, {});
  EXPECT_EQ(tok_->decode(r.input_ids),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\ncaf\u00e9"
            "<|im_end|>\n<|im_start|>assistant\n\nhello<|im_end|>\n");
  auto sup = runs(r.labels);
  ASSERT_EQ(sup.size(), 1u);
  EXPECT_EQ(tok_->decode(std::vector<int64_t>(r.input_ids.begin() + sup[0].first,
                                              r.input_ids.begin() + sup[0].second)),
            "hello<|im_end|>\n");
  EXPECT_EQ(r.input_ids[sup[0].first - 1], tok_->token_to_id("\u010a\u010a").value());  // "\n\n"
}

TEST(MergedImageTokens, MatchesSpecTable) {
  // shared/spec/qwen2_vl.md section 2: resized HxW -> merged tokens = (h/28)*(w/28).
  EXPECT_EQ(vlm::merged_image_tokens(1, 476 / 14, 644 / 14), 391);
  EXPECT_EQ(vlm::merged_image_tokens(1, 1092 / 14, 1932 / 14), 2691);
  EXPECT_EQ(vlm::merged_image_tokens(1, 2912 / 14, 4368 / 14), 16224);
  EXPECT_EQ(vlm::merged_image_tokens(1, 56 / 14, 56 / 14), 4);
  EXPECT_EQ(vlm::merged_image_tokens(1, 336 / 14, 336 / 14), 144);
}

TEST_F(ChatTemplate, Errors) {
  std::vector<ChatTurn> one_image = {{"user", {ChatItem::Image()}}};
  EXPECT_THROW(vlm::render_chat(*tok_, one_image, {}), vlm::Error);        // count missing
  EXPECT_THROW(vlm::render_chat(*tok_, one_image, {4, 4}), vlm::Error);    // too many
  EXPECT_THROW(vlm::render_chat(*tok_, one_image, {0}), vlm::Error);       // non-positive
  std::vector<ChatTurn> literal = {{"user", {ChatItem::Text("see <|image_pad|>"), ChatItem::Image()}}};
  EXPECT_THROW(vlm::render_chat(*tok_, literal, {4}), vlm::Error);
  EXPECT_THROW(vlm::merged_image_tokens(1, 3, 4), vlm::Error);
  // A tokenizer without vision markers cannot render images, and says which token is missing.
  auto plain = vlm::BpeTokenizer::from_json_text(vlmtest::make_tiny_model(false).j.dump(), "plain.json");
  try {
    vlm::render_chat(*plain, one_image, {4});
    FAIL() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("<|vision_start|>"), std::string::npos) << e.what();
  }
  std::vector<ChatTurn> text_only = {{"user", {ChatItem::Text("hello")}}};
  EXPECT_NO_THROW(vlm::render_chat(*plain, text_only, {}));
}

}  // namespace
