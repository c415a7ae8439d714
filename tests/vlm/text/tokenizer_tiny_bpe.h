// A small byte-level BPE tokenizer.json built in memory for offline tests: 256 byte
// tokens, left-to-right merges for a few words (plus ties on "aaaa"), the Qwen Split
// regex, NFC, and added tokens (ChatML specials, a non-special "<think>", a longer
// "<|im_end|>x" to test leftmost-longest matching, and optionally the vision markers).
// Also a string-based reference BPE to check the real one against.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "vlm/text/unicode.h"

namespace vlm::test {

using nlohmann::json;
using vlm::unicode::byte_to_char;

inline const char* kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Byte-level strings of the words we build merges for (left-to-right merges per word).
// Words with a leading space come first so that they end up as single tokens.
inline const std::vector<std::string> kWords = {" hello", "hello", " world", "world", " the", "the",
                                         "aaaa",  "aaaaaaaa", "ab", "abab", "ing", " Ġ",
                                         "안녕", "   ", "\n\n", "12"};

inline std::string to_byte_level(std::string_view bytes) {
  std::string s;
  for (unsigned char b : bytes) s += byte_to_char()[b];
  return s;
}

// Splits a byte-level string into its characters (each one original byte).
inline std::vector<std::string> chars_of(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    vlm::unicode::next_code_point(s, j);
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

struct TinyModel {
  json j;
  std::map<std::string, int64_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};

inline TinyModel make_tiny_model(bool with_vision = true) {
  TinyModel m;
  for (int b = 0; b < 256; ++b) m.vocab[byte_to_char()[b]] = b;
  std::set<std::pair<std::string, std::string>> seen;
  auto add_merge = [&](const std::string& a, const std::string& b) {
    if (!seen.insert({a, b}).second) return;
    m.merges.push_back({a, b});
    if (!m.vocab.count(a + b)) {
      int64_t id = static_cast<int64_t>(m.vocab.size());
      m.vocab[a + b] = id;
    }
  };
  add_merge(byte_to_char()['a'], byte_to_char()['a']);  // "aa" early: ties matter for "aaaa"
  for (const auto& w : kWords) {
    auto cs = chars_of(to_byte_level(w));
    std::string acc = cs[0];
    for (size_t i = 1; i < cs.size(); ++i) {
      add_merge(acc, cs[i]);
      acc += cs[i];
    }
  }
  add_merge("aa", "aa");
  json vocab = json::object();
  for (const auto& [t, id] : m.vocab) vocab[t] = id;
  json merges = json::array();
  for (size_t i = 0; i < m.merges.size(); ++i) {
    if (i % 2)  // both formats: ["a", "b"] and "a b"
      merges.push_back({m.merges[i].first, m.merges[i].second});
    else
      merges.push_back(m.merges[i].first + " " + m.merges[i].second);
  }
  int64_t next = static_cast<int64_t>(m.vocab.size());
  json added = json::array();
  for (auto [content, special] : std::vector<std::pair<std::string, bool>>{
           {"<|endoftext|>", true}, {"<|im_start|>", true}, {"<|im_end|>", true},
           {"<|im_end|>x", false}, {"<think>", false}, {"<|vision_start|>", true},
           {"<|vision_end|>", true}, {"<|image_pad|>", true}}) {
    const bool vision = content == "<|vision_start|>" || content == "<|vision_end|>" ||
                        content == "<|image_pad|>";
    if (vision && !with_vision) continue;
    added.push_back({{"id", next++}, {"content", content}, {"special", special},
                     {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}});
  }
  m.j = {{"version", "1.0"},
         {"added_tokens", added},
         {"normalizer", {{"type", "NFC"}}},
         {"pre_tokenizer",
          {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"}, {"pattern", {{"Regex", kQwenPattern}}}, {"behavior", "Isolated"},
              {"invert", false}},
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
         {"decoder", {{"type", "ByteLevel"}}},
         {"model",
          {{"type", "BPE"}, {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}}}};
  return m;
}

// Reference BPE: strings, lowest rank first, leftmost on ties, rescanning every time.
inline std::vector<int64_t> reference_bpe(const TinyModel& m, std::string_view bytes) {
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t i = 0; i < m.merges.size(); ++i) rank[m.merges[i]] = i;
  std::vector<std::string> syms = chars_of(to_byte_level(bytes));
  while (syms.size() > 1) {
    size_t best = SIZE_MAX, best_rank = SIZE_MAX;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto it = rank.find({syms[i], syms[i + 1]});
      if (it != rank.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best == SIZE_MAX) break;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + best + 1);
  }
  std::vector<int64_t> ids;
  for (const auto& s : syms) ids.push_back(m.vocab.at(s));
  return ids;
}

}  // namespace vlm::test
