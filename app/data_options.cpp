// Recipe -> data/'s option structs (see data_options.h).
#include "app/data_options.h"

namespace vlmtrain {

vlm::data::DatasetOptions dataset_options(const Recipe& recipe) {
  const DataSection& d = recipe.data;
  vlm::data::DatasetOptions o;
  o.format = vlm::data::parse_dataset_format(d.format);
  o.image_root = d.image_root;
  o.ocr_prompt = d.prompt;
  o.max_bad_fraction = d.max_bad_fraction;
  return o;
}

vlm::data::SampleOptions sample_options(const Recipe& recipe) {
  vlm::data::SampleOptions o;
  o.system_prompt = recipe.data.system_prompt;
  return o;
}

vlm::data::PixelConfig pixel_config(const Recipe& recipe) {
  vlm::data::PixelConfig c;
  c.limits.min_pixels = recipe.data.min_pixels;
  c.limits.max_pixels = recipe.data.max_pixels;
  c.max_image_tokens = recipe.data.max_image_tokens;
  return c;
}

}  // namespace vlmtrain
