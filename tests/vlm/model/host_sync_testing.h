// A micro-batch as collate builds it for training (collate/micro_batch.h): right padded, with
// the M-RoPE position ids, loss rows and image rows computed on the host. Shared by the
// host-sync tests (host_sync_test.cpp on the CPU, host_sync_cuda_test.cpp on a GPU).
#pragma once
#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "vlm/model/config.h"
#include "vlm/model/rope_index.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::test {

// Two right-padded rows as collate builds them; with_images: a 4-token and an 8-token image.
inline vlm::Batch collate_like_batch(const vlm::VlmConfig& c, bool with_images) {
  std::vector<std::vector<int64_t>> rows(2);
  std::vector<std::vector<int64_t>> labels(2);
  const int64_t n_img[2] = {4, 8};
  for (int r = 0; r < 2; ++r) {
    rows[r] = {5 + r, 6, 7};
    if (with_images) {
      rows[r].push_back(c.vision_start_token_id);
      for (int64_t i = 0; i < n_img[r]; ++i) rows[r].push_back(c.image_token_id);
      rows[r].push_back(c.vision_end_token_id);
    }
    labels[r].assign(rows[r].size(), -100);
    for (int64_t a = 0; a < 5 + r; ++a) {
      rows[r].push_back(100 + a);
      labels[r].push_back(100 + a);
    }
  }
  const int64_t L = static_cast<int64_t>(std::max(rows[0].size(), rows[1].size()));
  vlm::Batch b;
  b.input_ids = torch::zeros({2, L}, torch::kInt64);
  b.labels = torch::full({2, L}, -100, torch::kInt64);
  b.attention_mask = torch::zeros({2, L}, torch::kInt64);
  for (int r = 0; r < 2; ++r)
    for (size_t t = 0; t < rows[r].size(); ++t) {
      b.input_ids[r][static_cast<int64_t>(t)] = rows[r][t];
      b.labels[r][static_cast<int64_t>(t)] = labels[r][t];
      b.attention_mask[r][static_cast<int64_t>(t)] = 1;
    }
  if (with_images) {
    const int64_t m = c.vision.spatial_merge_size;
    b.image_grid_thw = torch::tensor({int64_t{1}, 2 * m, 2 * m, int64_t{1}, 2 * m, 4 * m}, torch::kInt64).view({2, 3});
    torch::manual_seed(3);
    b.pixel_values = torch::randn({(4 + 8) * m * m, c.vision.patch_dim()});
  }
  b.position_ids = vlm::get_rope_index(b.input_ids, b.image_grid_thw, b.attention_mask, c).position_ids;
  b.loss_rows = vlm::supervised_rows(b.labels);
  b.image_rows = vlm::image_token_rows(b.input_ids, c.image_token_id);
  b.right_padded = true;
  return b;
}

}  // namespace vlm::test
