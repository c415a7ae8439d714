// Recipe -> data/'s option structs (see data_options.h).
#include "app/config/data_options.h"

#include <filesystem>

#include "data/processor_config.h"
#include "vlm/runtime/check.h"
#include "vlm/families/registry.h"

namespace vlm::app {

vlm::data::DatasetOptions dataset_options(const Recipe& recipe) {
  const DataSection& d = recipe.data;
  vlm::data::DatasetOptions o;
  o.format = vlm::data::parse_dataset_format(d.format);
  o.image_root = d.image_root;
  o.ocr_prompt = d.prompt;
  o.max_bad_fraction = d.max_bad_fraction;
  return o;
}

vlm::data::SampleOptions sample_options(const Recipe& recipe, const vlm::VlmConfig& cfg) {
  vlm::data::SampleOptions o;
  o.system_prompt = recipe.data.system_prompt;
  o.default_system = vlm::family_spec(cfg.family).default_system;
  o.chat_template = vlm::family_spec(cfg.family).chat_template;
  return o;
}

vlm::data::PixelConfig pixel_config(const Recipe& recipe, const vlm::VlmConfig& cfg) {
  const std::string model_dir = recipe.model.preset.empty() ? recipe.model.path : std::string();
  vlm::data::PixelConfig c = vlm::data::model_pixel_config(cfg, model_dir);
  const DataSection& d = recipe.data;
  if (d.min_pixels > 0) c.limits.min_pixels = d.min_pixels;
  if (d.max_pixels > 0) c.limits.max_pixels = d.max_pixels;
  c.max_image_tokens = d.max_image_tokens;
  VLM_CHECK(c.limits.min_pixels <= c.limits.max_pixels, recipe.location("data.min_pixels"),
            ": data.min_pixels: min_pixels ", c.limits.min_pixels, " is larger than max_pixels ",
            c.limits.max_pixels, " (", d.min_pixels > 0 ? "recipe" : "the model's default", " vs ",
            d.max_pixels > 0 ? "recipe" : "the model's default",
            "; hint: set data.min_pixels / data.max_pixels, 0 = the model's default)");
  const int64_t f = c.geometry.factor();
  VLM_CHECK(c.max_image_tokens <= 0 || c.max_image_tokens * f * f >= c.limits.min_pixels,
            recipe.location("data.max_image_tokens"), ": data.max_image_tokens: a cap of ",
            c.max_image_tokens, " tokens (", c.max_image_tokens * f * f, " pixels at ", f, "x", f,
            " pixels per token) is below min_pixels ", c.limits.min_pixels,
            " (hint: raise the cap to at least ", (c.limits.min_pixels + f * f - 1) / (f * f),
            " or lower data.min_pixels)");
  return c;
}

vlm::VlmConfig recipe_model_config(const Recipe& recipe) {
  const ModelSection& m = recipe.model;
  if (!m.preset.empty()) return vlm::preset(m.preset);
  namespace fs = std::filesystem;
  if (!m.path.empty() && fs::exists(fs::path(m.path) / "config.json")) return vlm::load_hf_config(m.path);
  // No model config (a tokenizer-only directory): the default geometry of VlmConfig under
  // the registry's first family, for its processor and chat defaults.
  vlm::VlmConfig c;
  c.family = vlm::family_names().front();
  return c;
}

}  // namespace vlm::app
