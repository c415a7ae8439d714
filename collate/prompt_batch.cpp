#include "collate/prompt_batch.h"

#include <algorithm>

#include "vlm/runtime/check.h"

namespace vlm::collate {

vlm::Batch left_padded_prompt_batch(const std::vector<const vlm::TokenizedSample*>& samples,
                                    int64_t pad_token_id) {
  VLM_CHECK(!samples.empty(), "left_padded_prompt_batch: no prompts (use filler_prompt_batch)");
  const int64_t rows = static_cast<int64_t>(samples.size());
  int64_t len = 0;
  for (const auto* s : samples) {
    VLM_CHECK(!s->input_ids.empty(), "sample ", s->index, ": empty prompt (expected >= 1 token)");
    len = std::max<int64_t>(len, static_cast<int64_t>(s->input_ids.size()));
  }
  vlm::Batch b;
  b.input_ids = torch::full({rows, len}, pad_token_id, torch::kLong);
  b.attention_mask = torch::zeros({rows, len}, torch::kLong);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto mask = b.attention_mask.accessor<int64_t, 2>();
  std::vector<torch::Tensor> pixels;
  std::vector<int64_t> grids;
  for (int64_t r = 0; r < rows; ++r) {
    const vlm::TokenizedSample& s = *samples[size_t(r)];
    const int64_t off = len - static_cast<int64_t>(s.input_ids.size());
    for (size_t t = 0; t < s.input_ids.size(); ++t) {
      ids[r][off + int64_t(t)] = s.input_ids[t];
      mask[r][off + int64_t(t)] = 1;
    }
    if (s.grid_thw.empty()) continue;
    int64_t patches = 0;
    for (const auto& g : s.grid_thw) {
      patches += g[0] * g[1] * g[2];
      grids.insert(grids.end(), g.begin(), g.end());
    }
    VLM_CHECK(s.pixel_values.defined() && s.pixel_values.size(0) == patches, "sample ", s.index,
              ": pixel_values has ",
              s.pixel_values.defined() ? s.pixel_values.size(0) : int64_t(0),
              " rows but its image grids need ", patches);
    pixels.push_back(s.pixel_values);
  }
  if (!pixels.empty()) {
    b.pixel_values = torch::cat(pixels, 0);
    b.image_grid_thw = torch::tensor(grids, torch::kLong).view({-1, 3});
  }
  return b;
}

vlm::Batch filler_prompt_batch(int64_t pad_token_id) {
  vlm::Batch b;
  b.input_ids = torch::full({1, 1}, pad_token_id, torch::kLong);
  b.attention_mask = torch::ones({1, 1}, torch::kLong);
  return b;
}

}  // namespace vlm::collate
