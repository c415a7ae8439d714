#include "data/token_counts.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "vlm/runtime/check.h"

namespace vlm::data {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kCacheVersion = 1;

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  void str(const std::string& s) {
    const uint64_t n = s.size();
    bytes(&n, sizeof n);  // length prefix: ("ab","c") != ("a","bc")
    bytes(s.data(), s.size());
  }
  void i64(int64_t v) { bytes(&v, sizeof v); }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }
};

json file_stamp(const std::string& jsonl) {
  std::error_code ec;
  const auto size = fs::file_size(jsonl, ec);
  const auto mtime = fs::last_write_time(jsonl, ec).time_since_epoch().count();
  return json{{"jsonl_size", int64_t(size)}, {"jsonl_mtime", int64_t(mtime)}};
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return json::object();
  try {
    json j = json::parse(in);
    return j.is_object() ? j : json::object();
  } catch (const std::exception&) {
    return json::object();
  }
}

// counts by line of one file's cache section when its key matches, else empty.
std::map<int64_t, std::pair<TextTokenCounts, std::string>> read_section(
    const std::string& jsonl, const std::string& tok_id, const SampleOptions& opts) {
  std::map<int64_t, std::pair<TextTokenCounts, std::string>> out;
  const json j = read_json(dataset_index_path(jsonl));
  if (!j.contains("text_tokens")) return out;
  try {
    const json& s = j["text_tokens"];
    json key = file_stamp(jsonl);
    key["version"] = kCacheVersion;
    key["tokenizer"] = tok_id;
    key["system_prompt"] = opts.system_prompt;
    key["default_system"] = opts.default_system;
    key["chat_template"] = static_cast<int>(opts.chat_template);
    for (auto& [k, v] : key.items())
      if (!s.contains(k) || s[k] != v) return out;
    for (auto& [line, v] : s.at("counts").items())
      out[std::stoll(line)] = {{v.at(0).get<int64_t>(), v.at(1).get<int64_t>()},
                               v.at(2).get<std::string>()};
  } catch (const std::exception&) {
    out.clear();  // damaged section: recount
  }
  return out;
}

bool write_section(const std::string& jsonl, const std::string& tok_id, const SampleOptions& opts,
                   const std::map<int64_t, std::pair<TextTokenCounts, std::string>>& counts) {
  const std::string path = dataset_index_path(jsonl);
  json j = read_json(path);  // keep the image probes written by load_dataset
  json s = file_stamp(jsonl);
  s["version"] = kCacheVersion;
  s["tokenizer"] = tok_id;
  s["system_prompt"] = opts.system_prompt;
  s["default_system"] = opts.default_system;
  s["chat_template"] = static_cast<int>(opts.chat_template);
  json c = json::object();
  for (const auto& [line, v] : counts)
    c[std::to_string(line)] = {v.first.text_tokens, v.first.supervised_tokens, v.second};
  s["counts"] = std::move(c);
  j["text_tokens"] = std::move(s);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) return false;
    out << j.dump() << "\n";
    if (!out.good()) return false;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  return !ec;
}

}  // namespace

TextTokenCounts count_text_tokens(const vlm::Tokenizer& tok, const Record& record,
                                  const SampleOptions& opts) {
  const auto turns = record_chat_turns(record);
  int64_t n_images = 0;
  for (const auto& t : turns)
    for (const auto& it : t.content) n_images += it.kind == vlm::ChatItem::Kind::kImage;
  // One placeholder pad per image: removed from the count below.
  const vlm::RenderedChat rc = vlm::render_chat(tok, turns, std::vector<int64_t>(size_t(n_images), 1),
                                                chat_options(opts));
  TextTokenCounts c;
  c.text_tokens = int64_t(rc.input_ids.size()) - n_images;
  for (int64_t l : rc.labels) c.supervised_tokens += l != vlm::kIgnoreIndex;
  return c;
}

std::string tokenizer_identity(const vlm::Tokenizer& tok) {
  Fnv f;
  f.str(tok.kind());
  const int64_t n = tok.vocab_size();
  f.i64(n);
  for (int64_t id = 0; id < n; ++id) {
    try {
      f.str(tok.id_to_token(id));
    } catch (const std::exception&) {
      f.str("\x01<gap>");  // an id without a token (sparse added-token ids)
    }
    f.i64(tok.is_special(id) ? 1 : 0);
  }
  // Merges / scores / normalisation show in how a fixed text splits.
  for (int64_t id : tok.encode("Hello world! The quick brown fox, 12345 r\xC3\xA9sum\xC3\xA9 "
                               "\xE6\x96\x87\xE5\xAD\x97 \t\n  OCR-text_ok?"))
    f.i64(id);
  return f.hex();
}

std::string record_turns_hash(const Record& record) {
  Fnv f;
  for (const Turn& t : record.turns) {
    f.str(t.role);
    f.str(t.content);
  }
  return f.hex();
}

std::vector<TextTokenCounts> dataset_text_token_counts(
    const Dataset& ds, const vlm::Tokenizer& tok, const SampleOptions& opts, bool use_cache,
    TextCountStats* stats, const std::function<void(const std::string&)>& warn) {
  TextCountStats st;
  std::vector<TextTokenCounts> out(ds.records.size());
  const std::string tok_id = use_cache ? tokenizer_identity(tok) : std::string();
  // Records grouped by file, in order.
  std::map<std::string, std::vector<size_t>> by_file;
  for (size_t i = 0; i < ds.records.size(); ++i) by_file[ds.records[i].source].push_back(i);
  for (const auto& [file, idx] : by_file) {
    std::map<int64_t, std::pair<TextTokenCounts, std::string>> cache;
    if (use_cache && !file.empty()) cache = read_section(file, tok_id, opts);
    bool dirty = false;
    for (size_t i : idx) {
      const Record& r = ds.records[i];
      const std::string h = record_turns_hash(r);
      auto it = cache.find(r.line);
      if (it != cache.end() && it->second.second == h) {
        out[i] = it->second.first;
        ++st.cached;
        continue;
      }
      out[i] = count_text_tokens(tok, r, opts);
      ++st.computed;
      cache[r.line] = {out[i], h};
      dirty = true;
    }
    if (use_cache && dirty && !file.empty() &&
        !write_section(file, tok_id, opts, cache)) {
      const std::string m = vlm::str("warning: could not write text token counts to ",
                                     dataset_index_path(file), " (read-only folder?)");
      if (warn) warn(m);
      else std::cerr << m << "\n";
    }
  }
  if (stats) *stats = st;
  return out;
}

}  // namespace vlm::data
