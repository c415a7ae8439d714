#include "vlm/families/registry.h"

#include "vlm/runtime/check.h"

namespace vlm {

// The entry `const ModelFamilySpec& <name>_family()` that a file under vlm/families/ defines
// (declared here, at block scope, so that registering a family is one line and no header).
#define VLM_FAMILY(name)                           \
  [] {                                             \
    extern const ModelFamilySpec& name##_family(); \
    return &name##_family();                       \
  }()

const std::vector<const ModelFamilySpec*>& model_families() {
  // The registry: one line per architecture.
  static const std::vector<const ModelFamilySpec*> all = {
      VLM_FAMILY(qwen2_vl),
      VLM_FAMILY(qwen2_5_vl),
      VLM_FAMILY(qwen3_vl),
      VLM_FAMILY(qwen3_5),
      VLM_FAMILY(qwen3_vl_moe),
      VLM_FAMILY(qwen3_5_moe),
  };
  return all;
}

#undef VLM_FAMILY

const ModelFamilySpec& family_spec(const std::string& family) {
  const ModelFamilySpec* s = find_family(family);
  VLM_CHECK(s != nullptr, "model family '", family, "' is not registered (expected one of ", known_model_types(),
            "; hint: build a config with vlm::preset or vlm::parse_hf_config, which set its family)");
  return *s;
}

const ModelFamilySpec* find_family(const std::string& model_type) {
  for (const ModelFamilySpec* s : model_families())
    if (s->model_type == model_type) return s;
  return nullptr;
}

std::string known_model_types() {
  std::string out;
  for (const ModelFamilySpec* s : model_families()) out += (out.empty() ? "'" : ", '") + s->model_type + "'";
  return out;
}

}  // namespace vlm
