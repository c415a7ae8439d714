// Synthetic tokenized samples for collate tests: random text ids (never special tokens),
// images as <vision_start> + image pads (t*gh*gw/merge^2) + <vision_end> with random pixels
// [patches, cfg.vision.patch_dim()], and the last `answer` tokens supervised. Deterministic
// for a given RNG state. Geometry follows cfg.vision (Qwen2: patch 14, Qwen3: patch 16).
#pragma once
#include <array>
#include <random>
#include <vector>

#include "collate/step_plan.h"
#include "vlm/model/config.h"
#include "vlm/model/sample.h"

namespace vlm::test {

inline vlm::TokenizedSample synthetic_sample(const vlm::VlmConfig& cfg, std::mt19937_64& rng,
                                             int64_t index, int64_t text,
                                             const std::vector<std::array<int64_t, 3>>& grids,
                                             int64_t answer) {
  vlm::TokenizedSample s;
  s.index = index;
  auto word = [&] { return 10 + static_cast<int64_t>(rng() % 1000); };
  for (int64_t i = 0; i < text / 2; ++i) s.input_ids.push_back(word());
  std::vector<torch::Tensor> pixels;
  for (const auto& g : grids) {
    s.input_ids.push_back(cfg.vision_start_token_id);
    for (int64_t i = 0; i < g[0] * g[1] * g[2] / cfg.vision.merge_unit(); ++i)
      s.input_ids.push_back(cfg.image_token_id);
    s.input_ids.push_back(cfg.vision_end_token_id);
    auto gen = torch::make_generator<at::CPUGeneratorImpl>(rng());
    pixels.push_back(torch::randn({g[0] * g[1] * g[2], cfg.vision.patch_dim()}, gen));
    s.grid_thw.push_back(g);
  }
  for (int64_t i = 0; i < text - text / 2; ++i) s.input_ids.push_back(word());
  s.labels.assign(s.input_ids.size(), -100);
  for (size_t i = s.input_ids.size() - answer; i < s.input_ids.size(); ++i) s.labels[i] = s.input_ids[i];
  if (!pixels.empty()) s.pixel_values = torch::cat(pixels, 0);
  return s;
}

// The step plan's view of a synthetic sample: each image at exactly its grid's size
// (patch and merge of the model the sample was made for; defaults: Qwen2-VL's).
inline vlm::collate::SampleCost synthetic_cost(const vlm::TokenizedSample& s, int64_t patch = 14,
                                               int64_t merge = 2) {
  vlm::collate::SampleCost c;
  c.index = s.index;
  int64_t pads = 0;
  for (const auto& g : s.grid_thw) {
    c.images.push_back({g[1] * patch, g[2] * patch});
    pads += g[0] * g[1] * g[2] / (merge * merge);
  }
  c.text_tokens = static_cast<int64_t>(s.input_ids.size()) - pads;
  return c;
}

// Budgets under which synthetic images keep their exact grid (min_pixels one merged token)
// at resize factor `factor` (patch x merge; Qwen3-VL: 32).
inline vlm::collate::Budgets synthetic_budgets(int64_t factor = 28) {
  vlm::collate::Budgets b;
  b.factor = factor;
  b.pixels.min_pixels = factor * factor;
  b.max_image_tokens = 64;
  b.max_tokens = 120;
  b.batch_image_tokens = 64;
  return b;
}

}  // namespace vlm::test
