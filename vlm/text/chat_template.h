// Chat rendering (ChatML, as Qwen2-VL's chat_template) + supervision labels.
//
//   <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n      (when turn 0 is not system)
//   <|im_start|>user\n<|vision_start|><|image_pad|>*N<|vision_end|>Read the text.<|im_end|>\n
//   <|im_start|>assistant\nHELLO<|im_end|>\n                           (supervised: HELLO<|im_end|>\n)
//   <|im_start|>assistant\n                                             (add_generation_prompt)
//
// Families: Qwen2-VL / Qwen2.5-VL insert the default system turn above; Qwen3-VL's template
// is the same ChatML with no default system turn (default_system = "", from the family's
// registry entry, ModelFamilySpec::default_system). Known difference from the published
// Qwen3-VL template: it renders a system turn only as the first turn and drops a later one,
// and renders only user / assistant (/ tool) roles; this renderer renders every turn it is
// given (datasets put system turns first; record roles are system | user | assistant).
//
// Qwen3.5 (ChatTemplate::kQwen3_5; the published template is transcribed in scripts/ for
// the tests, and docs/qwen35_text.md says what it does) differs from ChatML above:
//   - each turn's content is trimmed (leading / trailing whitespace, as Python's str.strip);
//   - an assistant turn after the last user turn starts with a think block,
//     "<think>\n{reasoning}\n</think>\n\n", the reasoning taken from the answer text when it
//     holds "</think>" (else empty); earlier assistant turns drop their reasoning;
//   - the generation prompt is "<|im_start|>assistant\n<think>\n" (enable_thinking) or
//     "<|im_start|>assistant\n<think>\n\n</think>\n\n" (the default here: see ChatOptions);
//   - a system turn is only allowed first (and without images); roles other than system,
//     user and assistant, and a conversation without a user turn, are errors (as the
//     template raises).
// Supervised for Qwen3.5: each assistant answer (after the think block) with its
// "<|im_end|>\n", and the think block too when it holds reasoning; an empty think block is
// never supervised.
//
// The same template serves both backends: a tiny sentencepiece model is trained with
// chat_special_tokens() as user-defined symbols (sp_trainer_flags()), so there is no
// separate "plain" template to keep in sync.
//
// Token ids equal what HF produces for the rendered text (tokenizer(text) with the image
// pads already expanded): the whole text is encoded in one call, so pre-tokenisation
// across item boundaries is the same; labels come from token byte offsets. A token that
// straddles the start of an answer (only possible when an answer starts with a
// newline that merges with the header's) is not supervised.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "vlm/text/tokenizer.h"

namespace vlm {

constexpr int64_t kIgnoreIndex = -100;  // label of unsupervised positions

struct ChatItem {
  enum class Kind { kText, kImage };
  Kind kind = Kind::kText;
  std::string text;  // UTF-8, kText only (normalised to NFC when rendered)

  static ChatItem Text(std::string t) { return {Kind::kText, std::move(t)}; }
  static ChatItem Image() { return {Kind::kImage, {}}; }
};

struct ChatTurn {
  std::string role;  // "system" | "user" | "assistant" (others rendered, never supervised)
  std::vector<ChatItem> content;
};

// Which published template render_chat follows.
enum class ChatTemplate {
  kChatML,   // Qwen2-VL, Qwen2.5-VL, Qwen3-VL (Instruct)
  kQwen3_5,  // Qwen3.5 / Qwen3.6 (dense and MoE)
};

struct ChatOptions {
  // The template to follow: the model family's (its registry entry decides, as for
  // default_system).
  ChatTemplate chat_template = ChatTemplate::kChatML;
  // Inserted as a system turn when the first turn's role is not "system"; empty = none.
  // Default: Qwen2-VL's; callers serving any model take the family's (see above).
  std::string default_system = "You are a helpful assistant.";
  // Append "<|im_start|>assistant\n" (generation prompts in eval); kQwen3_5 adds its think
  // block after it (enable_thinking).
  bool add_generation_prompt = false;
  // kQwen3_5's generation prompt: false (default) appends the empty block
  // "<think>\n\n</think>\n\n" (the template's enable_thinking=false), so the model answers as
  // it was trained here (see the supervision rule above); true appends "<think>\n" (the
  // template's default), and the model writes its reasoning first.
  bool enable_thinking = false;
  // Label assistant answers (through <|im_end|> and the newline after it). When false,
  // every label is kIgnoreIndex.
  bool supervise_assistant = true;
};

// Positions of one image's pad tokens in input_ids: [begin, begin + length).
struct ImageSpan {
  int64_t begin = 0;
  int64_t length = 0;
};

struct RenderedChat {
  std::vector<int64_t> input_ids;      // [L]
  std::vector<int64_t> labels;         // [L]; kIgnoreIndex where not supervised
  std::vector<ImageSpan> image_spans;  // [images] in order of appearance
};

// Merged tokens of an image with patch grid (t, h, w): t*h*w / merge^2.
int64_t merged_image_tokens(int64_t grid_t, int64_t grid_h, int64_t grid_w, int64_t merge = 2);

// The rendered text with one <|image_pad|> per image (what HF apply_chat_template gives).
std::string render_chat_text(const std::vector<ChatTurn>& turns, const ChatOptions& options = {});

// Tokenises the conversation; image i's single <|image_pad|> becomes image_tokens[i]
// copies. Throws when image_tokens does not match the image items, a required special
// token is missing from the tokenizer, or the text itself contains "<|image_pad|>".
RenderedChat render_chat(const Tokenizer& tok, const std::vector<ChatTurn>& turns,
                         const std::vector<int64_t>& image_tokens,
                         const ChatOptions& options = {});

}  // namespace vlm
