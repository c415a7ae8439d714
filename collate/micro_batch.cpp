#include "collate/micro_batch.h"

#include "vlm/check.h"
#include "vlm/rope_index.h"
#include "vlm/vision_encoder.h"

namespace vlm::collate {

MicroBatch build_micro_batch(const std::vector<TokenizedSample>& samples, const VlmConfig& cfg,
                             int64_t pad_token_id) {
  VLM_CHECK(!samples.empty(), "build_micro_batch: no samples (use filler_micro_batch)");
  const int64_t rows = static_cast<int64_t>(samples.size());
  int64_t len = 0;
  for (const auto& s : samples) {
    VLM_CHECK(s.input_ids.size() == s.labels.size(), "sample ", s.index, ": ", s.input_ids.size(),
              " input ids but ", s.labels.size(), " labels (expected equal lengths)");
    VLM_CHECK(!s.input_ids.empty(), "sample ", s.index, ": no tokens");
    len = std::max<int64_t>(len, s.input_ids.size());
  }

  MicroBatch mb;
  auto ids = torch::full({rows, len}, pad_token_id, torch::kLong);
  auto labels = torch::full({rows, len}, -100, torch::kLong);
  auto mask = torch::zeros({rows, len}, torch::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto labels_a = labels.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  std::vector<torch::Tensor> pixels;
  std::vector<int64_t> grids;
  for (int64_t r = 0; r < rows; ++r) {
    const auto& s = samples[r];
    for (size_t t = 0; t < s.input_ids.size(); ++t) {
      ids_a[r][t] = s.input_ids[t];
      labels_a[r][t] = s.labels[t];
      mask_a[r][t] = 1;
      // Token t's label is predicted from position t-1: the first label never counts.
      if (t > 0 && s.labels[t] != -100) ++mb.supervised_tokens;
    }
    if (!s.grid_thw.empty()) {
      VLM_CHECK(s.pixel_values.defined(), "sample ", s.index, ": ", s.grid_thw.size(),
                " image grids but no pixel values");
      int64_t patches = 0;
      for (const auto& g : s.grid_thw) {
        patches += g[0] * g[1] * g[2];
        grids.insert(grids.end(), g.begin(), g.end());
      }
      VLM_CHECK(s.pixel_values.size(0) == patches, "sample ", s.index, ": pixel_values has ",
                s.pixel_values.size(0), " rows but its grids need ", patches);
      pixels.push_back(s.pixel_values);
      mb.n_images += static_cast<int64_t>(s.grid_thw.size());
    }
    mb.indices.push_back(s.index);
  }

  mb.batch.input_ids = ids;
  mb.batch.labels = labels;
  mb.batch.attention_mask = mask;
  if (!pixels.empty()) {
    mb.batch.pixel_values = torch::cat(pixels, 0);
    mb.batch.image_grid_thw = torch::tensor(grids, torch::kLong).view({-1, 3});
    mb.cu_seqlens = torch::tensor(image_cu_seqlens(mb.batch.image_grid_thw), torch::kLong);
  }
  mb.batch.position_ids =
      get_rope_index(ids, mb.batch.image_grid_thw, mask, cfg).position_ids;
  mb.batch.loss_rows = vlm::supervised_rows(labels);  // host-side, so the device never counts
  mb.batch.right_padded = true;
  return mb;
}

MicroBatch filler_micro_batch(int64_t pad_token_id) {
  MicroBatch mb;
  mb.filler = true;
  mb.batch.input_ids = torch::full({1, 1}, pad_token_id, torch::kLong);
  mb.batch.labels = torch::full({1, 1}, -100, torch::kLong);
  mb.batch.attention_mask = torch::ones({1, 1}, torch::kLong);
  mb.batch.position_ids = torch::zeros({3, 1, 1}, torch::kLong);
  mb.batch.loss_rows = torch::zeros({0}, torch::kLong);
  mb.batch.right_padded = true;
  return mb;
}

}  // namespace vlm::collate
