// The benches' fixed micro-batch (bench/step_bench, bench/lora_bench, bench/checkpoint_bench):
// `samples` rows of [text/2 prompt] <vs> [image_tokens image pads] <ve> [text - text/2
// answer], random token ids below the special tokens, the answer supervised, and one image
// per row of grid (1, 2, 2 x image_tokens) patches = image_tokens merged tokens, random
// pixels. On the CPU; seeded with `seed` (ids drawn first, then pixels).
#pragma once
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>

#include "vlm/model/config.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::bench {

inline vlm::Batch synthetic_batch(const vlm::VlmConfig& c, int64_t samples, int64_t text, int64_t image_tokens,
                                  uint64_t seed) {
  using torch::indexing::Slice;
  torch::manual_seed(seed);
  const int64_t b = samples, k = image_tokens, prompt = text / 2, l = text + k + 2;
  const int64_t vocab_hi = std::min<int64_t>(c.bos_token_id, c.text.vocab_size) - 1;
  torch::Tensor ids = torch::randint(10, std::max<int64_t>(11, vocab_hi), {b, l}, torch::kInt64);  // [B, L]
  torch::Tensor labels = torch::full({b, l}, -100, torch::kInt64);
  ids.index_put_({Slice(), prompt}, c.vision_start_token_id);
  ids.index_put_({Slice(), Slice(prompt + 1, prompt + 1 + k)}, c.image_token_id);
  ids.index_put_({Slice(), prompt + 1 + k}, c.vision_end_token_id);
  const auto answer = Slice(prompt + k + 2, l);
  labels.index_put_({Slice(), answer}, ids.index({Slice(), answer}));
  vlm::Batch batch;
  batch.input_ids = ids;
  batch.labels = labels;
  batch.attention_mask = torch::ones({b, l}, torch::kInt64);
  batch.pixel_values = torch::randn({b * 4 * k, c.vision.patch_dim()});  // [B * 4K patches, patch_dim]
  batch.image_grid_thw = torch::tensor({int64_t{1}, int64_t{2}, 2 * k}, torch::kInt64).repeat({b, 1});
  return batch;
}

}  // namespace vlm::bench
