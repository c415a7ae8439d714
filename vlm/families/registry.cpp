#include "vlm/families/registry.h"

#include "vlm/runtime/check.h"

namespace vlm {

const std::vector<const ModelFamilySpec*>& model_families() {
  // The registry: one line per architecture.
  static const std::vector<const ModelFamilySpec*> all = {
      &qwen2_vl_family(),
      &qwen2_5_vl_family(),
      &qwen3_vl_family(),
  };
  return all;
}

const ModelFamilySpec& family_spec(Family f) {
  for (const ModelFamilySpec* s : model_families())
    if (s->family == f) return *s;
  VLM_ASSERT(false, "model family ", static_cast<int>(f), " has no registry entry");
  return *model_families().front();
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
