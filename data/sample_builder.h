// Sample building: a Record (+ its decoded, resized images) -> vlm::TokenizedSample.
//
//   Record turns (roles already ChatML: system | user | assistant; LLaVA human/gpt mapped)
//     "<image>" markers in a turn's content become image items in place, in image order
//   -> render_chat (ChatML; labels only on assistant answers, through <|im_end|>\n; the
//      system turn: the recipe's, else the model family's default, e.g. none for Qwen3-VL)
//   -> image i's single <|image_pad|> expanded to its merged tokens t*gh*gw/m^2
//   -> pixel_values = concat of each image's [patches_i, C*T*p*p] in prompt order, grid_thw
//
// Truncation (issue #5): the caller (collate's step plan) may give a target length; the
// tail of the sequence is cut to it. A cut inside an image's pad tokens, or one that
// leaves no supervised token, throws SampleSkip with a reason: the caller counts and
// skips the sample. Images whose pads lie wholly after the cut are dropped with their
// pixel rows, so input_ids, pixel_values and grid_thw always agree.
//
// Generation prompts (eval): the turns before the last assistant turn, then
// "<|im_start|>assistant\n"; no labels; the references come back separately.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "vlm/text/chat_template.h"
#include "vlm/runtime/check.h"
#include "vlm/model/sample.h"
#include "vlm/text/tokenizer.h"

namespace vlm::data {

// SampleOptions::system_prompt value for "no system turn at all".
inline constexpr const char* kNoSystemTurn = "none";

struct SampleOptions {
  // recipe data.system_prompt; "" = default_system below, "none" = no system turn
  // (kNoSystemTurn), anything else = that text as the system turn
  std::string system_prompt;
  // The model family's default system turn (vlm::family_spec(cfg.family).default_system;
  // "" = none, as Qwen3-VL). Default: Qwen2-VL's chat template's.
  std::string default_system = vlm::ChatOptions{}.default_system;
  // The model family's template (vlm::family_spec(cfg.family).chat_template).
  vlm::ChatTemplate chat_template = vlm::ChatTemplate::kChatML;
  int64_t max_length = 0;     // cut the tail to this many tokens; 0 = no truncation
};

// A sample that cannot be built under the policy (the caller counts and skips it).
// reason: "cut inside image" | "no supervised tokens".
struct SampleSkip : vlm::Error {
  SampleSkip(std::string reason, const std::string& detail)
      : vlm::Error(detail), reason(std::move(reason)) {}
  std::string reason;
};

// ChatML role of a record role: human -> user, gpt/model -> assistant; others as given.
std::string chatml_role(const std::string& role);

// Record turns -> chat turns; each kImageMarker becomes an image item in place (empty text
// pieces dropped). `n_turns` < 0: all turns, else only the first n_turns.
std::vector<vlm::ChatTurn> record_chat_turns(const Record& r, int64_t n_turns = -1);

// Chat options for the recipe's system prompt over the family's default.
vlm::ChatOptions chat_options(const SampleOptions& opts, bool generation = false);

// Builds a training sample. images: the record's images decoded and resized (one entry
// per record image, load_record_images()). index: the global dataset index.
// returns input_ids/labels [L] (L <= max_length when set), pixel_values [sum patches,
// C*T*p*p] (undefined when no image), grid_thw [n_images].
// Throws SampleSkip for the truncation cases above, vlm::Error for inconsistent input
// (image count != markers, a tokenizer without the ChatML specials).
vlm::TokenizedSample build_sample(const vlm::Tokenizer& tok, const Record& record,
                                  const RecordImages& images, const SampleOptions& opts,
                                  int64_t index = 0);

// Convenience: decode + resize (targets as in load_record_images: empty = smart_resize
// under cfg) + build_sample.
vlm::TokenizedSample load_sample(const vlm::Tokenizer& tok, const Record& record,
                                 const PixelConfig& cfg, const SampleOptions& opts,
                                 int64_t index = 0,
                                 const std::vector<vlm::ImageSize>& targets = {});

struct GenerationPrompt {
  vlm::TokenizedSample sample;          // labels all kIgnoreIndex; images of the prompt only
  std::vector<std::string> references;  // record.answers (deduplicated), else the last assistant turn
};

// Prompt for generation: turns before the last assistant turn (all turns when there is
// none) + "<|im_start|>assistant\n". Images whose markers are in those turns only.
// max_length is not applied (a prompt is never cut).
GenerationPrompt build_generation_prompt(const vlm::Tokenizer& tok, const Record& record,
                                         const RecordImages& images, const SampleOptions& opts,
                                         int64_t index = 0);

// Turns that make up the generation prompt of `record` (see above).
int64_t generation_prompt_turns(const Record& record);

// The references build_generation_prompt returns: record.answers without repeats, else the
// assistant turn after the prompt (empty when there is none).
std::vector<std::string> generation_references(const Record& record);

}  // namespace vlm::data
