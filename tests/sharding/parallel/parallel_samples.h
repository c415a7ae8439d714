// Shared by the tensor- and pipeline-parallel equality tests: the samples of a step (seeded by
// step, kind and index: every rank and the one-process reference build the same ones), their
// micro-batches in three row layouts, the fp64 copy for the reference, and the gradient
// comparison with its floor.
#pragma once
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <vector>

#include "collate/micro_batch.h"
#include "vlm/model/config.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::test {

// How collate lays out a micro-batch's rows.
enum class RowLayout { kRight, kLeftMask, kPacked };
inline const char* row_layout_name(RowLayout l) {
  return l == RowLayout::kRight ? "right-padded" : l == RowLayout::kLeftMask ? "masked" : "packed";
}

// Sample i of `kind` (0 image, 1 text-only) at `step`, of `per_kind` per kind: a prompt of
// 3 + i tokens, for an image one of 1x4x4 or 1x4x8 patches (even / odd i), then 3 + (i + step) % 4
// supervised answer tokens.
inline vlm::TokenizedSample parallel_sample(const vlm::VlmConfig& c, int step, int kind, int i, int per_kind) {
  torch::manual_seed(1000 * step + 100 * kind + i);
  vlm::TokenizedSample s;
  s.index = kind * per_kind + i;
  const int64_t prompt = 3 + i, answer = 3 + (i + step) % 4;
  auto text = torch::randint(10, 1000, {prompt + answer}, torch::kInt64);
  for (int64_t k = 0; k < prompt; ++k) s.input_ids.push_back(text[k].item<int64_t>());
  if (kind == 0) {
    const std::array<int64_t, 3> grid = i % 2 == 0 ? std::array<int64_t, 3>{1, 4, 4} : std::array<int64_t, 3>{1, 4, 8};
    const int64_t patches = grid[0] * grid[1] * grid[2];
    s.grid_thw.push_back(grid);
    s.pixel_values = torch::randn({patches, c.vision.patch_dim()});
    s.input_ids.push_back(c.vision_start_token_id);
    for (int64_t k = 0; k < patches / c.vision.merge_unit(); ++k) s.input_ids.push_back(c.image_token_id);
    s.input_ids.push_back(c.vision_end_token_id);
  }
  s.labels.assign(s.input_ids.size(), -100);
  for (int64_t k = prompt; k < prompt + answer; ++k) {
    s.input_ids.push_back(text[k].item<int64_t>());
    s.labels.push_back(text[k].item<int64_t>());
  }
  return s;
}

// collate's micro-batch of `samples` in `layout` (masked: the right-padded rows through the
// attention-mask path).
inline vlm::Batch parallel_batch(const std::vector<vlm::TokenizedSample>& samples, const vlm::VlmConfig& cfg,
                                 RowLayout layout) {
  if (layout == RowLayout::kPacked) return vlm::collate::build_packed_micro_batch(samples, cfg).batch;
  vlm::Batch b = vlm::collate::build_micro_batch(samples, cfg, /*pad_token_id=*/0).batch;
  if (layout == RowLayout::kLeftMask) b.right_padded = false;
  return b;
}

// The batch for an fp64 reference model.
inline vlm::Batch to_fp64(vlm::Batch b) {
  if (b.pixel_values.defined()) b.pixel_values = b.pixel_values.to(torch::kFloat64);
  return b;
}

// A gradient's max |diff| over max(max |grad|, 1e-2), i.e. at most 1e-7 absolute for a tensor
// whose whole gradient is below 1e-2: Gated DeltaNet's per-head A_log and dt_bias (~2e-4 to
// 8e-3, sums over every token of the recurrence, with cancellation) carry fp32 rounding of
// ~1e-9 absolute, 1e-5 of their largest: with a 1e-3 floor, one process in fp32 against
// itself in fp64 reads 5e-6 on A_log and the tp 2 run 1.04e-5 (tiny-qwen3.5, 2026-11-29). A
// wrong gradient is wrong by its own size, so the floor hides none. The model's largest
// gradients are O(1).
inline double grad_diff_floored(const torch::Tensor& got, const torch::Tensor& want) {
  const double scale = std::max(want.abs().max().item<double>(), 1e-2);
  return (got.to(torch::kFloat64) - want).abs().max().item<double>() / scale;
}

}  // namespace vlm::test
