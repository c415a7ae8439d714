// Typed reads of config.json values for the families' config parsers (family_*.cpp):
// every wrong type, missing key or out-of-range integer throws vlm::Error naming the file
// and the dotted key ("vision_config.depth").
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlm/runtime/check.h"
#include "vlm/model/config.h"

namespace vlm::config_json {

using json = nlohmann::json;

// An integer that must be written as one: nlohmann converts floats to integers with a
// plain cast, which is undefined behaviour out of range (1e300) and silently truncates 2.5.
inline int64_t integer_value(const json& v, const std::string& what, const std::string& src) {
  VLM_CHECK(v.is_number_integer(), src, ": key '", what, "' must be an integer, found ",
            v.dump().substr(0, 64), " (a JSON ", v.type_name(), ")");
  VLM_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX), src, ": key '",
            what, "' = ", v.dump(), " does not fit in int64");
  return v.get<int64_t>();
}

// Reads `obj[key]` as T; `where` is the dotted path for messages ("vision_config.").
template <typename T>
T get_req(const json& obj, const std::string& key, const std::string& where, const std::string& src) {
  auto it = obj.find(key);
  VLM_CHECK(it != obj.end() && !it->is_null(), src, ": missing key '", where, key,
            "' (hint: is this a Qwen2-VL / Qwen2.5-VL / Qwen3-VL config.json?)");
  if constexpr (std::is_same_v<T, int64_t>) {
    return integer_value(*it, where + key, src);
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    VLM_CHECK(it->is_array(), src, ": key '", where, key, "' must be a list of integers, found a JSON ",
              it->type_name());
    std::vector<int64_t> out;
    for (size_t i = 0; i < it->size(); ++i)
      out.push_back(integer_value((*it)[i], str(where, key, "[", i, "]"), src));
    return out;
  } else {
    try {
      return it->get<T>();
    } catch (const std::exception& e) {
      throw Error(str(src, ": key '", where, key, "' has the wrong type (", it->type_name(),
                      "): ", e.what()));
    }
  }
}

template <typename T>
T get_opt(const json& obj, const std::string& key, const T& dflt, const std::string& where,
          const std::string& src) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  return get_req<T>(obj, key, where, src);
}

// The object at `key` (absent or null: an empty object); anything else throws.
inline const json& object_or_empty(const json& obj, const std::string& key, const std::string& src) {
  static const json empty = json::object();
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return empty;
  VLM_CHECK(it->is_object(), src, ": key '", key, "' must be an object, found a JSON ", it->type_name());
  return *it;
}

// The text section's rotary keys: `rope_scaling` (legacy; HF takes it first) or
// `rope_parameters` (newer): mrope_section, rope_theta, mrope_interleaved, rope_type.
void parse_rope(const json& text, TextConfig& t, const std::string& where, const std::string& src);

// Keys the text sections of all families share (sizes, eps, pad id, theta, activation),
// with transformers' defaults as given.
struct TextDefaults {
  int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads;
  int64_t num_key_value_heads;  // when absent (null: num_attention_heads)
  double rms_norm_eps, rope_theta;
  int64_t max_position_embeddings;
};
void parse_text_common(const json& tj, const std::string& tw, const TextDefaults& d, TextConfig& t,
                       const std::string& src);
// Top-level special ids, tie flag, dtype; bos/eos from the text section `tj` (else the top
// level). text_tie_counts: a true tie_word_embeddings in `tj` ties the head too (Qwen2's
// configs turn the top-level flag on from text_config; Qwen3-VL's do not).
void parse_top_common(const json& top, const json& tj, const std::string& tw, bool text_tie_counts, VlmConfig& c,
                      const std::string& src);

// Placeholder special ids of a from-scratch preset at the top of its vocabulary V:
// bos V-7, eos V-5, vision start / end V-4 / V-3, image / video pad V-2 / V-1 (the trainer
// overwrites them from the tokenizer it trains: use_tokenizer_special_ids).
inline void top_of_vocab_special_ids(VlmConfig& c) {
  const int64_t v = c.text.vocab_size;
  c.bos_token_id = v - 7;
  c.eos_token_id = v - 5;
  c.vision_start_token_id = v - 4;
  c.vision_end_token_id = v - 3;
  c.image_token_id = v - 2;
  c.video_token_id = v - 1;
}

}  // namespace vlm::config_json
