// The pieces of the Qwen3.5 registry entry (qwen3_5.cpp) that its mixture-of-experts sibling
// (qwen3_5_moe.cpp) builds on: the same tower, hybrid decoder features and key table, with
// the MoE class's text defaults.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "vlm/families/config_json.h"
#include "vlm/model/config.h"

namespace vlm::qwen3_5 {

// Sets the features generic code reads (config.h): zero-centred RMSNorms, q/k norm, gated
// attention, interleaved partial M-RoPE, the DeepStack-free Qwen3-VL tower.
void features(VlmConfig& c);
// config.json (nested) with absent text sizes taking `d` (intermediate_size 0: the key is
// not read or written: every layer is sparse).
VlmConfig parse(const nlohmann::json& top, const std::string& src, const config_json::TextDefaults& d);
// The dense entry's config.json (model_type "qwen3_5"; a sibling renames it).
nlohmann::json to_json(const VlmConfig& c, const config_json::TextDefaults& d);
void validate(const VlmConfig& c, const std::string& src);

// Published geometry: hidden / layers / heads / kv / intermediate / linear key and value heads,
// the ViT's width / depth / MLP / heads, tied head. Every 4th layer full attention, head_dim
// 256, linear head dims 128, partial rotary 0.25 with M-RoPE [11, 11, 10], theta 1e7, vocab
// 248,320, patch 16, 48 x 48 positions.
struct Geometry {
  int64_t hidden, layers, heads, kv_heads, inter, lin_k_heads, lin_v_heads;
  int64_t vit_width, vit_depth, vit_inter, vit_heads;
  bool tie;
};
VlmConfig real(const Geometry& g);

}  // namespace vlm::qwen3_5
