// Text token counts known before any image is decoded (docs/design.md, step 2): each record is
// rendered with the tokenizer, every image standing in as a single placeholder pad, so
//   sequence length = text_tokens + sum of the images' merged tokens
// for whatever image budget the step plan later chooses.
//
// The counts are cached in the dataset index file beside each JSONL (<jsonl>.index.json,
// shared with dataset.cpp's image probes) under the key "text_tokens":
//   {"version": 1, "jsonl_size": .., "jsonl_mtime": .., "tokenizer": <identity hash>,
//    "system_prompt": "..", "default_system": "..",
//    "counts": {"<line>": [text_tokens, supervised, turns_hash]}}
// A different tokenizer (content hash, not path), system prompt, model family default
// system turn (Qwen2-VL's vs Qwen3-VL's none), JSONL file, or record content (e.g. a
// changed OCR prompt, via turns_hash) invalidates the affected counts. Image tokens are
// not cached: they depend on the model's resize factor and are computed per step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/sample_builder.h"
#include "vlm/text/tokenizer.h"

namespace vlm::data {

struct TextTokenCounts {
  int64_t text_tokens = 0;        // every token except the image pads
  int64_t supervised_tokens = 0;  // labels != -100 (assistant answers + <|im_end|>\n)
};

// Renders `record` (system prompt from opts; max_length ignored) and counts.
TextTokenCounts count_text_tokens(const vlm::Tokenizer& tok, const Record& record,
                                  const SampleOptions& opts);

// Identity of a tokenizer's behaviour, as 16 hex digits: a hash of its kind, every
// vocabulary entry, the special flags and the ids of a fixed probe text (merges and
// normalisation). Equal for the same tokenizer loaded from anywhere.
std::string tokenizer_identity(const vlm::Tokenizer& tok);

// Hash of a record's turns (roles and contents) as 16 hex digits.
std::string record_turns_hash(const Record& record);

struct TextCountStats {
  int64_t cached = 0;    // counts read from index files
  int64_t computed = 0;  // counts rendered now
};

// Counts for every record of `ds` (same order). use_cache: read and update the
// "text_tokens" section of each JSONL's index file (a write failure is only a warning via
// `warn`, or std::cerr when empty).
std::vector<TextTokenCounts> dataset_text_token_counts(
    const Dataset& ds, const vlm::Tokenizer& tok, const SampleOptions& opts,
    bool use_cache = true, TextCountStats* stats = nullptr,
    const std::function<void(const std::string&)>& warn = {});

}  // namespace vlm::data
