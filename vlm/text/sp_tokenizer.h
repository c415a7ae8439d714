// SentencePiece backend (.model files) through libsentencepiece, loaded at run time.
//
// Why dlopen: Debian's libsentencepiece bundles its own protobuf-lite and exports those
// symbols; linked into a binary that also loads LibTorch's libprotobuf.so.32, the two
// interpose each other and the process crashes in static initialisation (checked:
// `vlmtrain --version` segfaults). So libsentencepiece(.so.0) and its trainer are opened
// with RTLD_LOCAL | RTLD_DEEPBIND on first use and called through their exported
// symbols; nothing in vlmtrain links them. Callers must not link libsentencepiece or
// libsentencepiece_train either: train with vlm::train_sentencepiece() below.
//
// Ids are the model's own ids; user_defined_symbols (e.g. "<|im_start|>") are matched
// in the text by sentencepiece itself, so the ChatML template works unchanged when a
// model was trained with chat_special_tokens() as user-defined symbols.
// Defaults without tokenizer_config.json: eos = "<|im_end|>" if the model has it, else
// the model's eos_id; pad = "<|endoftext|>" if present, else pad_id; bos = bos_id.
#pragma once
#include <memory>
#include <string>

#include "vlm/text/tokenizer.h"

namespace vlm {

// Whether the sentencepiece backend works in this build. It does not under AddressSanitizer:
// ASan's runtime aborts the process on dlopen(RTLD_DEEPBIND), and without RTLD_DEEPBIND the
// library's protobuf clashes with LibTorch's (see above). In such a build load() and
// train_sentencepiece() throw vlm::Error with this reason instead; `why` receives it.
bool sentencepiece_available(std::string* why = nullptr);

class SentencePieceTokenizer : public Tokenizer {
 public:
  static std::unique_ptr<SentencePieceTokenizer> load(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  std::vector<int64_t> encode(std::string_view text) const override;
  // Offsets are rebuilt from the pieces' surfaces; this needs a model whose
  // normalisation is the identity without a dummy prefix (sp_trainer_flags()), and
  // throws a vlm::Error naming the problem otherwise. encode() has no such limit.
  Encoding encode_with_offsets(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const override;
  std::string id_to_token(int64_t id) const override;
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  int64_t vocab_size() const override;
  bool is_special(int64_t id) const override;
  std::string kind() const override { return "sentencepiece"; }

 private:
  struct Impl;
  SentencePieceTokenizer();
  std::unique_ptr<Impl> impl_;
};

// Trainer flags for a tiny sentencepiece model that works with the ChatML template and
// round-trips text exactly (append to "--input=... --model_prefix=... --vocab_size=..."):
// chat_special_tokens() as user_defined_symbols, identity normalisation, whitespace
// kept as is, no dummy prefix, byte fallback (so any UTF-8 text encodes), no BOS/EOS/PAD
// pieces (the chat specials play those roles).
std::string sp_trainer_flags();

// SentencePieceTrainer::Train(args) through the run-time-loaded trainer library
// (libsentencepiece_train.so.0). Throws vlm::Error with the trainer's message.
void train_sentencepiece(const std::string& args);

}  // namespace vlm
