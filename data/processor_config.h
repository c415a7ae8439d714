// The image processor of a model: which PixelConfig its images go through.
//
//   PixelConfig px = model_pixel_config(cfg, "/models/Qwen3-VL-2B-Instruct");
//
// Three layers, later ones winning:
//   1. the family's processor defaults (vlm::family_spec(cfg.family).processor: mean, std,
//      min / max pixels) with the vision geometry of cfg.vision (patch, merge, temporal);
//   2. the model directory's preprocessor_config.json, when there is one (HF directories;
//      presets have none). Keys read, all optional, others ignored:
//        image_mean, image_std          3 numbers each
//        min_pixels, max_pixels         older transformers / Qwen2-VL hub files
//        size: {shortest_edge, longest_edge}
//                                       newer transformers (shortest_edge = min_pixels,
//                                       longest_edge = max_pixels); min_pixels / max_pixels
//                                       win when both are present, as in HF
//        patch_size, merge_size, temporal_patch_size
//                                       must equal config.json's vision values (an error
//                                       names the file, both values and a hint)
//   3. the recipe's data.min_pixels / max_pixels / max_image_tokens (app/config/data_options.h).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "data/pixel_pipeline.h"
#include "vlm/model/config.h"

namespace vlm::data {

// File name looked up in a model directory.
inline constexpr const char* kPreprocessorConfigFile = "preprocessor_config.json";

// Layer 1: the family's processor defaults with cfg.vision's geometry.
PixelConfig family_pixel_config(const vlm::VlmConfig& cfg);

// Layer 2 on top of `base` (whose geometry is config.json's): `j` is the parsed
// preprocessor_config.json, `src` its path for messages. Throws vlm::Error naming `src`
// for a wrong type or size, a non-positive value, or geometry that disagrees with `base`.
PixelConfig apply_preprocessor_config(PixelConfig base, const nlohmann::json& j,
                                      const std::string& src);

// Layers 1 + 2: model_dir "" (a preset) or a directory without preprocessor_config.json
// gives family_pixel_config(cfg). A file that is not valid JSON throws naming the file.
PixelConfig model_pixel_config(const vlm::VlmConfig& cfg, const std::string& model_dir);

}  // namespace vlm::data
