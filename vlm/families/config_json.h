// config.json for the families' parsers and writers (vlm/families/<name>.cpp): typed reads
// (every wrong type, missing key or out-of-range integer throws vlm::Error naming the file
// and the dotted key, "vision_config.depth"), the walkers of a family's key table, and the
// keys that need code in every Qwen family (rotary section, tied head, bos / eos, dtype).
//
// A family's key table is one function template listing each key, the field it fills and
// transformers' default, per JSON object (walker):
//
//   template <class W, class C> void fam_keys(W& top, W& text, W& vision, C& c) {
//     vision("depth", c.vision.depth, 32);
//     text("vocab_size", c.text.vocab_size, 151936);
//     top("image_token_id", c.image_token_id, 151655);
//   }
//
// Parsing walks it with KeyReader (field = the key's value, absent or null: the default),
// to_json with KeyWriter (key = the field): a key is named in one place for both.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlm/runtime/check.h"
#include "vlm/model/config.h"

namespace vlm::config_json {

// The text section's size defaults of a transformers config class (keys absent from a file);
// a dense family and its MoE sibling share a key table but not these.
struct TextDefaults {
  int64_t hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads;
  int64_t head_dim;  // 0: hidden_size / num_attention_heads
};

// The mixture-of-experts keys of a text section (Qwen3VLMoeTextConfig, Qwen3_5MoeTextConfig)
// with the class's defaults for num_experts, top-k and expert width.
template <class W, class T>
void moe_text_keys(W& text, T& t, int64_t experts, int64_t top_k, int64_t expert_width) {
  text("num_experts", t.num_experts, experts);
  text("num_experts_per_tok", t.num_experts_per_tok, top_k);
  text("moe_intermediate_size", t.moe_intermediate_size, expert_width);
  text("output_router_logits", t.output_router_logits, false);
  text("router_aux_loss_coef", t.router_aux_loss_coef, 0.001);
}

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

// A default takes the type of its field (so that 32 fills an int64_t, {7, 15} a vector).
template <typename T>
struct FieldType {
  using type = T;
};

// Reads a key table's entries from one JSON object; `where` is its dotted path for messages
// ("vision_config.", "text_config." or "" for the top level).
class KeyReader {
 public:
  KeyReader(const json& obj, std::string where, const std::string& src)
      : obj_(&obj), where_(std::move(where)), src_(&src) {}
  template <typename T>
  void operator()(const char* key, T& field, const typename FieldType<T>::type& dflt) {
    field = get_opt<T>(*obj_, key, dflt, where_, *src_);
  }
  // An optional token id: absent or null reads -1 (none).
  void id(const char* key, int64_t& field) { field = get_opt<int64_t>(*obj_, key, -1, where_, *src_); }

 private:
  const json* obj_;
  std::string where_;
  const std::string* src_;
};

// Writes a key table's entries into one JSON object.
class KeyWriter {
 public:
  explicit KeyWriter(json& obj) : obj_(&obj) {}
  template <typename T>
  void operator()(const char* key, const T& field, const typename FieldType<T>::type& /*dflt*/) {
    (*obj_)[key] = field;
  }
  // An optional token id: written only when set (>= 0).
  void id(const char* key, int64_t field) {
    if (field >= 0) (*obj_)[key] = field;
  }

 private:
  json* obj_;
};

// A double as config.json writes a field transformers validates as an int: an integer when
// it is one (2.0 -> 2), else the double.
inline json int_if_integral(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e9) return static_cast<int64_t>(x);
  return x;
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

// The text keys that need code, after the table: num_key_value_heads written as null means
// num_attention_heads (HF; absent: the table's default), and hidden_act must be "silu".
void parse_text_steps(const json& tj, TextConfig& t, const std::string& src);

// The top-level keys that need code: the tied head (the top-level flag, default false, or
// with text_tie_counts a true flag in the text section `tj`: Qwen2's configs turn the
// top-level flag on from text_config, Qwen3-VL's do not), bos / eos from `tj` else the top
// level (eos may be a list: its first id), the dtype (torch_dtype, else dtype).
void parse_top_steps(const json& top, const json& tj, const std::string& tw, bool text_tie_counts, VlmConfig& c,
                     const std::string& src);

// The Qwen3-VL-style tower's learned position table: num_position_embeddings must be a square
// (side x side, resampled to each image's grid); throws vlm::Error naming `src` and the key.
inline void check_position_table(const VisionConfig& v, const std::string& src) {
  const int64_t n = v.num_position_embeddings;
  const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
  VLM_CHECK(n >= 1 && n <= kMaxConfigSize && side * side == n, src, ": vision_config.num_position_embeddings is ", n,
            ", expected a square (a side x side table; released models: 2304 = 48^2)");
}

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
