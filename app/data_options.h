// Recipe -> data/'s option structs (data/ never sees app/recipe.h). Shared by train,
// eval and inspect so that every command reads a dataset the same way.
#pragma once
#include "app/recipe.h"
#include "data/dataset.h"
#include "data/pixel_pipeline.h"
#include "data/sample_builder.h"

namespace vlmtrain {

// [data] format, image_root, prompt, max_bad_fraction.
vlm::data::DatasetOptions dataset_options(const Recipe& recipe);
// [data] system_prompt (no truncation).
vlm::data::SampleOptions sample_options(const Recipe& recipe);
// [data] min/max pixels and max_image_tokens.
vlm::data::PixelConfig pixel_config(const Recipe& recipe);

}  // namespace vlmtrain
