// SentencePiece backend: libsentencepiece opened with dlopen(RTLD_DEEPBIND) (see header).
//
// The C++ methods are called through their exported (mangled) symbols as plain
// functions, per the Itanium C++ ABI: `this` is the first argument, and a returned
// sentencepiece::util::Status (a class with a non-trivial destructor) comes back through
// a hidden result pointer passed before `this`. Status holds one pointer (null = OK);
// its ToString and destructor are called through their symbols too.
#include "vlm/text/sp_tokenizer.h"

#include <dlfcn.h>

#include <cstring>
#include <fstream>
#include <mutex>

#include "vlm/runtime/check.h"
#include "vlm/text/unicode.h"

namespace vlm {
namespace {

struct StatusRaw {
  void* rep = nullptr;  // std::unique_ptr<Rep>: null means OK
};

// Function types of the symbols we use (`self` = SentencePieceProcessor*).
using CtorFn = void (*)(void* self);
using DtorFn = void (*)(void* self);
using LoadFn = void (*)(StatusRaw* ret, void* self, std::string_view path);
using EncodeIdsFn = void (*)(StatusRaw* ret, const void* self, std::string_view in,
                             std::vector<int>* ids);
using DecodeIdsFn = void (*)(StatusRaw* ret, const void* self, const std::vector<int>& ids,
                             std::string* out);
using IntFn = int (*)(const void* self);
using IdPredFn = bool (*)(const void* self, int id);
using IdToPieceFn = const std::string& (*)(const void* self, int id);
using PieceToIdFn = int (*)(const void* self, std::string_view piece);
using StatusToStringFn = std::string (*)(const StatusRaw* self);
using StatusDtorFn = void (*)(StatusRaw* self);
using TrainFn = void (*)(StatusRaw* ret, std::string_view args, void* iterator, std::string* proto);
using SetLogLevelFn = void (*)(int level);

constexpr size_t kProcessorBytes = 512;  // >= sizeof(SentencePieceProcessor) (48 in 0.1.97)

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsanBuild = true;  // GCC
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsanBuild = true;  // clang
#else
constexpr bool kAsanBuild = false;
#endif
#else
constexpr bool kAsanBuild = false;
#endif

void* open_lib(const char* name) {
  std::string why;
  VLM_CHECK(sentencepiece_available(&why), why);
  void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  VLM_CHECK(h != nullptr, "cannot load ", name, ": ", dlerror(),
            " (hint: apt-get install libsentencepiece0 / libsentencepiece-dev)");
  return h;
}

template <typename Fn>
Fn symbol(void* lib, const char* lib_name, const char* mangled) {
  void* p = dlsym(lib, mangled);
  VLM_CHECK(p != nullptr, lib_name, " lacks symbol ", mangled,
            " (expected sentencepiece 0.1.9x built with the C++11 ABI)");
  return reinterpret_cast<Fn>(p);
}

struct SpLib {
  CtorFn ctor;
  DtorFn dtor;
  LoadFn load;
  EncodeIdsFn encode_ids;
  DecodeIdsFn decode_ids;
  IntFn piece_size, unk_id, bos_id, eos_id, pad_id;
  IdPredFn is_control, is_unknown, is_byte;
  IdToPieceFn id_to_piece;
  PieceToIdFn piece_to_id;
  StatusToStringFn status_to_string;
  StatusDtorFn status_dtor;

  SpLib() {
    const char* n = "libsentencepiece.so.0";
    void* h = open_lib(n);
    ctor = symbol<CtorFn>(h, n, "_ZN13sentencepiece22SentencePieceProcessorC1Ev");
    dtor = symbol<DtorFn>(h, n, "_ZN13sentencepiece22SentencePieceProcessorD1Ev");
    load = symbol<LoadFn>(
        h, n, "_ZN13sentencepiece22SentencePieceProcessor4LoadESt17basic_string_viewIcSt11char_traitsIcEE");
    encode_ids = symbol<EncodeIdsFn>(
        h, n,
        "_ZNK13sentencepiece22SentencePieceProcessor6EncodeESt17basic_string_viewIcSt11char_"
        "traitsIcEEPSt6vectorIiSaIiEE");
    decode_ids = symbol<DecodeIdsFn>(
        h, n,
        "_ZNK13sentencepiece22SentencePieceProcessor6DecodeERKSt6vectorIiSaIiEEPNSt7__cxx1112basic_"
        "stringIcSt11char_traitsIcESaIcEEE");
    piece_size = symbol<IntFn>(h, n, "_ZNK13sentencepiece22SentencePieceProcessor12GetPieceSizeEv");
    unk_id = symbol<IntFn>(h, n, "_ZNK13sentencepiece22SentencePieceProcessor6unk_idEv");
    bos_id = symbol<IntFn>(h, n, "_ZNK13sentencepiece22SentencePieceProcessor6bos_idEv");
    eos_id = symbol<IntFn>(h, n, "_ZNK13sentencepiece22SentencePieceProcessor6eos_idEv");
    pad_id = symbol<IntFn>(h, n, "_ZNK13sentencepiece22SentencePieceProcessor6pad_idEv");
    is_control = symbol<IdPredFn>(h, n, "_ZNK13sentencepiece22SentencePieceProcessor9IsControlEi");
    is_unknown = symbol<IdPredFn>(h, n, "_ZNK13sentencepiece22SentencePieceProcessor9IsUnknownEi");
    is_byte = symbol<IdPredFn>(h, n, "_ZNK13sentencepiece22SentencePieceProcessor6IsByteEi");
    id_to_piece =
        symbol<IdToPieceFn>(h, n, "_ZNK13sentencepiece22SentencePieceProcessor9IdToPieceB5cxx11Ei");
    piece_to_id = symbol<PieceToIdFn>(
        h, n,
        "_ZNK13sentencepiece22SentencePieceProcessor9PieceToIdESt17basic_string_viewIcSt11char_"
        "traitsIcEE");
    status_to_string =
        symbol<StatusToStringFn>(h, n, "_ZNK13sentencepiece4util6Status8ToStringB5cxx11Ev");
    status_dtor = symbol<StatusDtorFn>(h, n, "_ZN13sentencepiece4util6StatusD1Ev");
    // Silence sentencepiece's own logging: it writes to std::cerr, and under RTLD_DEEPBIND
    // it would bind to libstdc++'s copy of std::cerr, which is never initialised when
    // the executable holds a copy-relocated std::cerr (crash, checked in the tests).
    // Errors still come back as Status messages.
    symbol<SetLogLevelFn>(h, n, "_ZN13sentencepiece7logging14SetMinLogLevelEi")(100);
  }

  // Turns a returned Status into "" (OK) or its message, and destroys it.
  std::string take(StatusRaw& st) const {
    if (st.rep == nullptr) return {};
    std::string msg = status_to_string(&st);
    status_dtor(&st);
    return msg.empty() ? "unknown sentencepiece error" : msg;
  }
};

const SpLib& sp_lib() {
  static const SpLib lib;  // immutable after first use
  return lib;
}

}  // namespace

bool sentencepiece_available(std::string* why) {
  if (!kAsanBuild) return true;
  if (why)
    *why = "the sentencepiece backend is unavailable in this AddressSanitizer build: "
           "libsentencepiece must be dlopen()ed with RTLD_DEEPBIND, which ASan does not support "
           "(hint: use a normal build for .model tokenizers, or a tokenizer.json)";
  return false;
}

struct SentencePieceTokenizer::Impl {
  const SpLib& lib = sp_lib();
  alignas(16) unsigned char processor[kProcessorBytes];
  bool constructed = false;
  std::vector<uint8_t> special;  // [vocab] control pieces and chat specials
  std::vector<int> surface_len;  // [vocab] bytes of input a piece stands for (-1: unknown)

  const void* self() const { return processor; }
  ~Impl() {
    if (constructed) lib.dtor(processor);
  }
};

SentencePieceTokenizer::SentencePieceTokenizer() : impl_(std::make_unique<Impl>()) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::load(const std::string& path) {
  VLM_CHECK(std::ifstream(path).good(), "cannot open sentencepiece model ", path);
  std::unique_ptr<SentencePieceTokenizer> tok(new SentencePieceTokenizer());
  Impl& m = *tok->impl_;
  const SpLib& lib = m.lib;
  std::memset(m.processor, 0, sizeof(m.processor));
  lib.ctor(m.processor);
  m.constructed = true;
  StatusRaw st;
  lib.load(&st, m.processor, path);
  std::string err = lib.take(st);
  VLM_CHECK(err.empty(), path, ": not a sentencepiece model: ", err);
  tok->source_ = path;

  const int n = lib.piece_size(m.self());
  m.special.assign(n, 0);
  m.surface_len.assign(n, -1);
  for (int i = 0; i < n; ++i) {
    if (lib.is_control(m.self(), i)) {
      m.special[i] = 1;
      m.surface_len[i] = 0;
    } else if (lib.is_byte(m.self(), i)) {
      m.surface_len[i] = 1;
    } else if (!lib.is_unknown(m.self(), i)) {
      std::string piece = lib.id_to_piece(m.self(), i);
      int len = 0;
      for (size_t k = 0; k < piece.size();) {
        if (piece.compare(k, 3, "\xE2\x96\x81") == 0) {  // U+2581 stands for one space
          len += 1;
          k += 3;
        } else {
          len += 1;
          ++k;
        }
      }
      m.surface_len[i] = len;
    }
  }
  for (const auto& name : chat_special_tokens())
    if (auto id = tok->token_to_id(name)) m.special[*id] = 1;
  auto nonneg = [](int id) -> std::optional<int64_t> {
    return id >= 0 ? std::optional<int64_t>(id) : std::nullopt;
  };
  auto eos = tok->token_to_id("<|im_end|>");
  auto pad = tok->token_to_id("<|endoftext|>");
  tok->specials_.eos = eos ? eos : nonneg(lib.eos_id(m.self()));
  tok->specials_.pad = pad ? pad : nonneg(lib.pad_id(m.self()));
  tok->specials_.bos = nonneg(lib.bos_id(m.self()));
  return tok;
}

std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view text) const {
  size_t bad = unicode::first_invalid_utf8(text);
  VLM_CHECK(bad == std::string::npos, "tokenizer: expected UTF-8 text, found an invalid byte at ",
            "offset ", bad, " (hint: convert the input to UTF-8)");
  std::vector<int> ids;
  StatusRaw st;
  impl_->lib.encode_ids(&st, impl_->self(), text, &ids);
  std::string err = impl_->lib.take(st);
  VLM_CHECK(err.empty(), source_, ": encode failed: ", err);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

Encoding SentencePieceTokenizer::encode_with_offsets(std::string_view text) const {
  Encoding enc;
  enc.ids = encode(text);
  enc.offsets.reserve(enc.ids.size());
  size_t at = 0;
  for (int64_t id : enc.ids) {
    const int len = impl_->surface_len[id];
    bool ok = len >= 0 && at + len <= text.size();
    if (ok && !impl_->lib.is_byte(impl_->self(), static_cast<int>(id)) && len > 0) {
      // The piece's surface must be the input's bytes (U+2581 <-> space).
      const std::string& piece = impl_->lib.id_to_piece(impl_->self(), static_cast<int>(id));
      size_t k = 0, j = at;
      for (; k < piece.size() && ok; ++j) {
        if (piece.compare(k, 3, "\xE2\x96\x81") == 0) {
          ok = text[j] == ' ';
          k += 3;
        } else {
          ok = text[j] == piece[k];
          ++k;
        }
      }
    }
    VLM_CHECK(ok, source_, ": cannot align sentencepiece tokens with the input at byte ", at,
              " (piece ", id, "); token offsets need a model trained with identity normalisation "
              "and no dummy prefix (hint: train it with vlm::sp_trainer_flags())");
    enc.offsets.emplace_back(at, at + len);
    at += len;
  }
  VLM_CHECK(at == text.size(), source_, ": sentencepiece tokens cover ", at, " of ", text.size(),
            " input bytes (hint: train the model with vlm::sp_trainer_flags())");
  return enc;
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::vector<int> v;
  v.reserve(ids.size());
  for (int64_t id : ids) {
    VLM_CHECK(id >= 0 && id < vocab_size(), source_, ": cannot decode id ", id,
              ", expected 0 <= id < ", vocab_size());
    if (skip_special && impl_->special[id]) continue;
    v.push_back(static_cast<int>(id));
  }
  std::string out;
  StatusRaw st;
  impl_->lib.decode_ids(&st, impl_->self(), v, &out);
  std::string err = impl_->lib.take(st);
  VLM_CHECK(err.empty(), source_, ": decode failed: ", err);
  return unicode::repair_utf8(out);
}

std::string SentencePieceTokenizer::id_to_token(int64_t id) const {
  VLM_CHECK(id >= 0 && id < vocab_size(), source_, ": no token with id ", id, " (vocab size ",
            vocab_size(), ")");
  return impl_->lib.id_to_piece(impl_->self(), static_cast<int>(id));
}

std::optional<int64_t> SentencePieceTokenizer::token_to_id(std::string_view token) const {
  const auto& lib = impl_->lib;
  int id = lib.piece_to_id(impl_->self(), token);
  int unk = lib.unk_id(impl_->self());
  if (id == unk && token != lib.id_to_piece(impl_->self(), unk)) return std::nullopt;
  return id;
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->lib.piece_size(impl_->self()); }

bool SentencePieceTokenizer::is_special(int64_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id];
}

std::string sp_trainer_flags() {
  std::string symbols;
  for (const auto& s : chat_special_tokens()) symbols += (symbols.empty() ? "" : ",") + s;
  return "--user_defined_symbols=" + symbols +
         " --normalization_rule_name=identity --remove_extra_whitespaces=false"
         " --add_dummy_prefix=false --byte_fallback=true --split_digits=true"
         " --allow_whitespace_only_pieces=true"
         " --unk_id=0 --bos_id=-1 --eos_id=-1 --pad_id=-1";
}

void train_sentencepiece(const std::string& args) {
  static std::mutex mu;  // the trainer is not re-entrant
  std::lock_guard<std::mutex> lock(mu);
  sp_lib();  // libsentencepiece first, so the trainer binds to the same copy
  const char* n = "libsentencepiece_train.so.0";
  static void* handle = open_lib(n);
  auto train = symbol<TrainFn>(
      handle, n,
      "_ZN13sentencepiece20SentencePieceTrainer5TrainESt17basic_string_viewIcSt11char_traitsIcEEPNS_"
      "16SentenceIteratorEPNSt7__cxx1112basic_stringIcS3_SaIcEEE");
  StatusRaw st;
  train(&st, args + " --minloglevel=100", nullptr, nullptr);
  std::string err = sp_lib().take(st);
  VLM_CHECK(err.empty(), "sentencepiece training failed: ", err, " (args: ", args, ")");
}

}  // namespace vlm
