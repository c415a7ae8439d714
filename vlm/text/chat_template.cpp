// ChatML and Qwen3.5 rendering, and label masks.
#include "vlm/text/chat_template.h"

#include <algorithm>

#include "vlm/runtime/check.h"
#include "vlm/text/unicode.h"

namespace vlm {
namespace {

constexpr const char* kImStart = "<|im_start|>";
constexpr const char* kImEnd = "<|im_end|>";
constexpr const char* kVisionStart = "<|vision_start|>";
constexpr const char* kVisionEnd = "<|vision_end|>";
constexpr const char* kImagePad = "<|image_pad|>";

// The rendered text plus where the supervised ranges and image placeholders are.
struct Layout {
  std::string text;
  std::vector<std::pair<size_t, size_t>> supervised;  // byte ranges, increasing
  std::vector<size_t> image_pads;                     // byte offset of each <|image_pad|>
};

Layout layout_chatml(const std::vector<ChatTurn>& turns, const ChatOptions& opt) {
  Layout l;
  auto turn = [&](const std::string& role, const std::vector<ChatItem>& items) {
    l.text += kImStart;
    l.text += unicode::nfc_hf(role);
    l.text += '\n';
    const size_t answer_begin = l.text.size();
    std::string pending;  // consecutive text items are normalised together
    auto flush = [&] {
      l.text += unicode::nfc_hf(pending);
      pending.clear();
    };
    for (const auto& item : items) {
      if (item.kind == ChatItem::Kind::kText) {
        pending += item.text;
      } else {
        flush();
        l.text += kVisionStart;
        l.image_pads.push_back(l.text.size());
        l.text += kImagePad;
        l.text += kVisionEnd;
      }
    }
    flush();
    l.text += kImEnd;
    l.text += '\n';
    if (role == "assistant" && opt.supervise_assistant)
      l.supervised.emplace_back(answer_begin, l.text.size());
  };
  if (!opt.default_system.empty() && (turns.empty() || turns[0].role != "system"))
    turn("system", {ChatItem::Text(opt.default_system)});
  for (const auto& t : turns) {
    VLM_CHECK(!t.role.empty(), "chat turn without a role (expected system, user or assistant)");
    turn(t.role, t.content);
  }
  if (opt.add_generation_prompt) {
    l.text += kImStart;
    l.text += "assistant\n";
  }
  return l;
}

// ---------------------------------------------------------------- Qwen3.5

constexpr const char* kThinkOpen = "<think>";
constexpr const char* kThinkClose = "</think>";

// Python's str.isspace: what the template's |trim strips.
bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// s without leading (`left`) / trailing (`right`) Python whitespace.
std::string py_strip(const std::string& s, bool left = true, bool right = true) {
  size_t first = std::string::npos, last_end = 0;  // first non-space code point, end of the last
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    if (is_py_space(unicode::next_code_point(s, i))) continue;
    if (first == std::string::npos) first = at;
    last_end = i;
  }
  if (first == std::string::npos) return "";
  const size_t b = left ? first : 0, e = right ? last_end : s.size();
  return s.substr(b, e - b);
}

// s without leading / trailing '\n' (Python's lstrip('\n') / rstrip('\n')).
std::string strip_newlines(const std::string& s, bool left) {
  if (left) return s.substr(std::min(s.find_first_not_of('\n'), s.size()));
  const size_t last = s.find_last_not_of('\n');
  return last == std::string::npos ? std::string() : s.substr(0, last + 1);
}

// A turn's content as the template's render_content gives it, then |trim: runs of text
// (consecutive text items joined, raw) and images, trimmed at both ends.
struct Run {
  bool image = false;
  std::string text;
};
std::vector<Run> trimmed_runs(const std::vector<ChatItem>& items) {
  std::vector<Run> runs;
  for (const auto& item : items) {
    const bool image = item.kind == ChatItem::Kind::kImage;
    if (image || runs.empty() || runs.back().image) runs.push_back({image, {}});
    runs.back().text += item.text;
  }
  if (!runs.empty() && !runs.front().image)
    runs.front().text = py_strip(runs.front().text, /*left=*/true, /*right=*/false);
  if (!runs.empty() && !runs.back().image)
    runs.back().text = py_strip(runs.back().text, /*left=*/false, /*right=*/true);
  return runs;
}

// The runs as one string with image markers (for the template's string tests).
std::string joined(const std::vector<Run>& runs) {
  std::string out;
  for (const auto& r : runs)
    out += r.image ? str(kVisionStart, kImagePad, kVisionEnd) : r.text;
  return out;
}

// Appends the runs to the layout: text in NFC, images as markers (pad offsets recorded).
void append_runs(Layout& l, const std::vector<Run>& runs) {
  for (const auto& r : runs) {
    if (!r.image) {
      l.text += unicode::nfc_hf(r.text);
      continue;
    }
    l.text += kVisionStart;
    l.image_pads.push_back(l.text.size());
    l.text += kImagePad;
    l.text += kVisionEnd;
  }
}

// Index of the last user turn that is a query (not a wrapped <tool_response>); throws when
// there is none, as the template does.
size_t last_query(const std::vector<ChatTurn>& turns) {
  for (size_t k = turns.size(); k-- > 0;) {
    if (turns[k].role != "user") continue;
    const std::string c = joined(trimmed_runs(turns[k].content));
    const std::string open = "<tool_response>", close = "</tool_response>";
    const bool tool = c.rfind(open, 0) == 0 && c.size() >= close.size() &&
                      c.compare(c.size() - close.size(), close.size(), close) == 0;
    if (!tool) return k;
  }
  throw Error("Qwen3.5 chat template: no user turn in the conversation (the template raises "
              "\"No user query found in messages.\")");
}

// Checks what the template raises on: roles, a system turn after the first, system images.
void check_qwen35_turns(const std::vector<ChatTurn>& turns) {
  for (size_t k = 0; k < turns.size(); ++k) {
    const ChatTurn& t = turns[k];
    VLM_CHECK(t.role == "system" || t.role == "user" || t.role == "assistant",
              "Qwen3.5 chat template: turn ", k, " has role \"", t.role,
              "\"; vlmtrain renders system, user and assistant turns");
    if (t.role != "system") continue;
    VLM_CHECK(k == 0, "Qwen3.5 chat template: turn ", k, " is a system turn, but a system turn ",
              "must come first (the template raises \"System message must be at the beginning.\")");
    for (const auto& item : t.content)
      VLM_CHECK(item.kind == ChatItem::Kind::kText, "Qwen3.5 chat template: the system turn ",
                "holds an image (the template raises \"System message cannot contain images.\")");
  }
}

// Splits an answer holding "</think>" as the template does: returns the reasoning (after the
// last <think> before the first </think>, trimmed) and leaves in `content` what follows the
// last </think> (leading newlines dropped). Without "</think>": "" and `content` unchanged.
std::string split_reasoning(std::string& content) {
  const size_t close = content.find(kThinkClose);
  if (close == std::string::npos) return "";
  std::string reasoning = strip_newlines(content.substr(0, close), /*left=*/false);
  if (const size_t open = reasoning.rfind(kThinkOpen); open != std::string::npos)
    reasoning = reasoning.substr(open + std::string(kThinkOpen).size());
  const size_t after = content.rfind(kThinkClose) + std::string(kThinkClose).size();
  content = strip_newlines(content.substr(after), /*left=*/true);
  return py_strip(strip_newlines(reasoning, /*left=*/true));
}

// One assistant turn. `think`: it comes after the last user query, so it gets a think block.
void append_qwen35_answer(Layout& l, const ChatTurn& t, bool think, bool supervise) {
  const std::vector<Run> runs = trimmed_runs(t.content);
  for (const auto& r : runs)
    VLM_CHECK(!r.image, "Qwen3.5 chat template: an assistant turn holds an image, which ",
              "vlmtrain does not render");
  std::string content = joined(runs);
  const std::string reasoning = split_reasoning(content);
  l.text += str(kImStart, "assistant\n");
  size_t begin = l.text.size();
  if (think) {
    l.text += str(kThinkOpen, "\n", unicode::nfc_hf(reasoning), "\n", kThinkClose, "\n\n");
    if (reasoning.empty()) begin = l.text.size();  // the empty block is not supervised
  }
  l.text += str(unicode::nfc_hf(content), kImEnd, "\n");
  if (supervise) l.supervised.emplace_back(begin, l.text.size());
}

Layout layout_qwen35(std::vector<ChatTurn> turns, const ChatOptions& opt) {
  if (!opt.default_system.empty() && (turns.empty() || turns[0].role != "system"))
    turns.insert(turns.begin(), ChatTurn{"system", {ChatItem::Text(opt.default_system)}});
  check_qwen35_turns(turns);
  const size_t query = last_query(turns);
  Layout l;
  for (size_t k = 0; k < turns.size(); ++k) {
    const ChatTurn& t = turns[k];
    if (t.role == "assistant") {
      append_qwen35_answer(l, t, k > query, opt.supervise_assistant);
      continue;
    }
    l.text += str(kImStart, t.role, "\n");
    append_runs(l, trimmed_runs(t.content));
    l.text += str(kImEnd, "\n");
  }
  if (opt.add_generation_prompt)
    l.text += str(kImStart, "assistant\n", kThinkOpen, "\n",
                  opt.enable_thinking ? "" : str("\n", kThinkClose, "\n\n"));
  return l;
}

Layout layout_chat(const std::vector<ChatTurn>& turns, const ChatOptions& opt) {
  return opt.chat_template == ChatTemplate::kQwen3_5 ? layout_qwen35(turns, opt)
                                                     : layout_chatml(turns, opt);
}

}  // namespace

int64_t merged_image_tokens(int64_t grid_t, int64_t grid_h, int64_t grid_w, int64_t merge) {
  VLM_CHECK(grid_t > 0 && grid_h > 0 && grid_w > 0 && grid_h % merge == 0 && grid_w % merge == 0,
            "image grid (t, h, w) = (", grid_t, ", ", grid_h, ", ", grid_w,
            ") must be positive with h and w divisible by the merge size ", merge);
  return grid_t * grid_h * grid_w / (merge * merge);
}

std::string render_chat_text(const std::vector<ChatTurn>& turns, const ChatOptions& options) {
  return layout_chat(turns, options).text;
}

RenderedChat render_chat(const Tokenizer& tok, const std::vector<ChatTurn>& turns,
                         const std::vector<int64_t>& image_tokens, const ChatOptions& options) {
  const Layout l = layout_chat(turns, options);
  VLM_CHECK(l.image_pads.size() == image_tokens.size(), "chat has ", l.image_pads.size(),
            " image item(s) but ", image_tokens.size(), " image token count(s) were given");
  tok.special_id(kImStart, "the ChatML template");
  tok.special_id(kImEnd, "the ChatML template");
  int64_t pad_id = -1;
  if (!image_tokens.empty()) {
    tok.special_id(kVisionStart, "image items");
    tok.special_id(kVisionEnd, "image items");
    pad_id = tok.special_id(kImagePad, "image items");
  }

  const Encoding enc = tok.encode_with_offsets(l.text);
  RenderedChat out;
  size_t total = enc.ids.size();
  for (int64_t n : image_tokens) {
    VLM_CHECK(n > 0, "image token count must be positive, got ", n);
    total += static_cast<size_t>(n) - 1;
  }
  out.input_ids.reserve(total);
  out.labels.reserve(total);
  size_t sup = 0, image = 0;
  for (size_t k = 0; k < enc.ids.size(); ++k) {
    const int64_t id = enc.ids[k];
    const auto [b, e] = enc.offsets[k];
    if (id == pad_id) {
      VLM_CHECK(image < l.image_pads.size() && b == l.image_pads[image],
                "the chat text itself contains \"", kImagePad, "\" (byte ", b,
                "); remove it from the sample text: image pads come only from image items");
      out.image_spans.push_back({static_cast<int64_t>(out.input_ids.size()), image_tokens[image]});
      out.input_ids.insert(out.input_ids.end(), image_tokens[image], pad_id);
      out.labels.insert(out.labels.end(), image_tokens[image], kIgnoreIndex);
      ++image;
      continue;
    }
    while (sup < l.supervised.size() && l.supervised[sup].second <= b) ++sup;
    bool supervised = sup < l.supervised.size() && b >= l.supervised[sup].first &&
                      e <= l.supervised[sup].second;
    out.input_ids.push_back(id);
    out.labels.push_back(supervised ? id : kIgnoreIndex);
  }
  VLM_CHECK(image == l.image_pads.size(), "tokenizer ", tok.source(), " produced ", image,
            " image pad token(s) for ", l.image_pads.size(), " image item(s)");
  return out;
}

}  // namespace vlm
