// The pieces of the Qwen3-VL registry entry (qwen3_vl.cpp) that its mixture-of-experts
// sibling (qwen3_vl_moe.cpp) builds on: the same vision tower, features and dense key table,
// with the MoE class's text defaults.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "vlm/families/config_json.h"
#include "vlm/model/config.h"

namespace vlm::qwen3_vl {

// Sets the features generic code reads (config.h): LayerNorm ViT with a tanh-GELU MLP, q/k
// norm, no attention bias, interleaved M-RoPE.
void features(VlmConfig& c);
// config.json (nested: text_config + vision_config) with absent text sizes taking `d`.
VlmConfig parse(const nlohmann::json& top, const std::string& src, const config_json::TextDefaults& d);
// The dense entry's config.json (model_type "qwen3_vl"; a sibling renames it).
nlohmann::json to_json(const VlmConfig& c, const config_json::TextDefaults& d);
void validate(const VlmConfig& c, const std::string& src);
// The published geometry: text hidden / MLP / layers / query heads (8 kv heads of 128), tied
// head, the 27 x 1152 tower (DeepStack 8/16/24) or the 24 x 1024 one (5/11/17).
VlmConfig real(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, bool tie, bool large_vit);

}  // namespace vlm::qwen3_vl
