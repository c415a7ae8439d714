// The config.json keys that need code in every Qwen family (see config_json.h).
#include "vlm/families/config_json.h"

namespace vlm::config_json {

void parse_rope(const json& text, TextConfig& t, const std::string& where0, const std::string& src) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {  // HF: rope_scaling wins
    auto it = text.find(key);
    if (it == text.end() || !it->is_object()) continue;
    const std::string where = where0 + key + ".";
    if (it->contains("mrope_section"))
      t.mrope_section = get_req<std::vector<int64_t>>(*it, "mrope_section", where, src);
    if (it->contains("rope_theta")) t.rope_theta = get_req<double>(*it, "rope_theta", where, src);
    t.mrope_interleaved = get_opt<bool>(*it, "mrope_interleaved", t.mrope_interleaved, where, src);
    std::string type = get_opt<std::string>(*it, "rope_type", "", where, src);
    if (type.empty()) type = get_opt<std::string>(*it, "type", "", where, src);
    VLM_CHECK(type.empty() || type == "mrope" || type == "default", src, ": key '", where,
              "rope_type' is '", type, "', expected 'mrope' or 'default' (hint: frequency "
              "scaling of the rotary embedding is not supported)");
    return;
  }
}

void parse_text_steps(const json& tj, TextConfig& t, const std::string& src) {
  // HF: the class default when absent, num_attention_heads when written as null.
  if (tj.contains("num_key_value_heads") && tj["num_key_value_heads"].is_null())
    t.num_key_value_heads = t.num_attention_heads;
  VLM_CHECK(t.hidden_act == "silu", src, ": text hidden_act is '", t.hidden_act, "', expected 'silu'");
}

void parse_top_steps(const json& top, const json& tj, const std::string& tw, bool text_tie_counts, VlmConfig& c,
                     const std::string& src) {
  c.tie_word_embeddings = get_opt<bool>(top, "tie_word_embeddings", false, "", src) ||
                          (text_tie_counts && get_opt<bool>(tj, "tie_word_embeddings", false, tw, src));
  c.bos_token_id = get_opt<int64_t>(tj, "bos_token_id", get_opt<int64_t>(top, "bos_token_id", 151643, "", src), tw, src);
  // eos_token_id: an integer or a list (the first is kept; generation reads its stop ids
  // from generation_config.json and the tokenizer).
  const json* eos = nullptr;
  std::string ew = tw;
  for (const json* obj : {&tj, &top}) {
    auto it = obj->find("eos_token_id");
    if (it != obj->end() && !it->is_null()) {
      eos = &*it;
      break;
    }
    ew = "";
  }
  if (eos == nullptr) {
    c.eos_token_id = 151645;
  } else if (eos->is_array() && !eos->empty()) {
    c.eos_token_id = integer_value((*eos)[0], ew + "eos_token_id[0]", src);
  } else {
    c.eos_token_id = integer_value(*eos, ew + "eos_token_id", src);
  }
  const std::string dtype = get_opt<std::string>(tj, "dtype", get_opt<std::string>(top, "dtype", "bfloat16", "", src), tw, src);
  c.torch_dtype = get_opt<std::string>(top, "torch_dtype", dtype, "", src);
}

}  // namespace vlm::config_json
