// ChatML rendering and label masks.
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

Layout layout_chat(const std::vector<ChatTurn>& turns, const ChatOptions& opt) {
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
