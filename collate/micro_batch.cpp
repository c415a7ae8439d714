#include "collate/micro_batch.h"

#include "vlm/runtime/check.h"
#include "vlm/model/rope_index.h"
#include "vlm/families/qwen2_vision.h"

namespace vlm::collate {

namespace {

// Tokens of one sample after the consistency checks shared by both builds.
int64_t checked_length(const TokenizedSample& s) {
  VLM_CHECK(s.input_ids.size() == s.labels.size(), "sample ", s.index, ": ", s.input_ids.size(),
            " input ids but ", s.labels.size(), " labels (expected equal lengths)");
  VLM_CHECK(!s.input_ids.empty(), "sample ", s.index, ": no tokens");
  return static_cast<int64_t>(s.input_ids.size());
}

// Appends the sample's pixel values [P_s, C*T*p*p] and grids (t, gh, gw), checked against
// each other, and records its index and image count in `mb`.
void collect_sample_images(const TokenizedSample& s, std::vector<torch::Tensor>* pixels,
                           std::vector<int64_t>* grids, MicroBatch* mb) {
  if (!s.grid_thw.empty()) {
    VLM_CHECK(s.pixel_values.defined(), "sample ", s.index, ": ", s.grid_thw.size(),
              " image grids but no pixel values");
    int64_t patches = 0;
    for (const auto& g : s.grid_thw) {
      patches += g[0] * g[1] * g[2];
      grids->insert(grids->end(), g.begin(), g.end());
    }
    VLM_CHECK(s.pixel_values.size(0) == patches, "sample ", s.index, ": pixel_values has ",
              s.pixel_values.size(0), " rows but its grids need ", patches);
    pixels->push_back(s.pixel_values);
    mb->n_images += static_cast<int64_t>(s.grid_thw.size());
  }
  mb->indices.push_back(s.index);
}

// pixel_values [P, ...], image_grid_thw [N, 3] and the vision cu_seqlens of the micro-batch.
void set_images(const std::vector<torch::Tensor>& pixels, const std::vector<int64_t>& grids, MicroBatch* mb) {
  if (pixels.empty()) return;
  mb->batch.pixel_values = torch::cat(pixels, 0);
  mb->batch.image_grid_thw = torch::tensor(grids, torch::kLong).view({-1, 3});
  mb->cu_seqlens = torch::tensor(image_cu_seqlens(mb->batch.image_grid_thw), torch::kLong);
}

}  // namespace

MicroBatch build_micro_batch(const std::vector<TokenizedSample>& samples, const VlmConfig& cfg,
                             int64_t pad_token_id) {
  VLM_CHECK(!samples.empty(), "build_micro_batch: no samples (use filler_micro_batch)");
  const int64_t rows = static_cast<int64_t>(samples.size());
  int64_t len = 0;
  for (const auto& s : samples) len = std::max(len, checked_length(s));

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
    collect_sample_images(s, &pixels, &grids, &mb);
  }

  mb.batch.input_ids = ids;
  mb.batch.labels = labels;
  mb.batch.attention_mask = mask;
  set_images(pixels, grids, &mb);
  mb.batch.position_ids =
      get_rope_index(ids, mb.batch.image_grid_thw, mask, cfg).position_ids;
  mb.batch.loss_rows = vlm::supervised_rows(labels);  // host-side, so the device never counts
  mb.batch.image_rows = vlm::image_token_rows(ids, cfg.image_token_id);  // likewise: placed by index
  mb.batch.right_padded = true;
  return mb;
}

MicroBatch build_packed_micro_batch(const std::vector<TokenizedSample>& samples, const VlmConfig& cfg) {
  VLM_CHECK(!samples.empty(), "build_packed_micro_batch: no samples (use filler_micro_batch)");
  std::vector<int64_t> cu = {0};
  for (const auto& s : samples) cu.push_back(cu.back() + checked_length(s));
  const int64_t len = cu.back();

  MicroBatch mb;
  std::vector<int64_t> ids, labels;
  ids.reserve(len);
  labels.reserve(len);
  std::vector<torch::Tensor> pixels;
  std::vector<int64_t> grids;
  for (const auto& s : samples) {
    for (size_t t = 0; t < s.input_ids.size(); ++t) {
      ids.push_back(s.input_ids[t]);
      // The first token's label would be the target of the previous sample's last token:
      // it never counts in the unpadded build either.
      labels.push_back(t == 0 ? -100 : s.labels[t]);
      if (t > 0 && s.labels[t] != -100) ++mb.supervised_tokens;
    }
    collect_sample_images(s, &pixels, &grids, &mb);
  }
  mb.batch.input_ids = torch::tensor(ids, torch::kLong).view({1, len});
  mb.batch.labels = torch::tensor(labels, torch::kLong).view({1, len});
  mb.batch.attention_mask = torch::ones({1, len}, torch::kLong);
  set_images(pixels, grids, &mb);
  mb.batch.text_cu_seqlens = torch::tensor(cu, torch::kLong);
  mb.batch.position_ids = packed_position_ids(mb.batch.input_ids, mb.batch.image_grid_thw, cu, cfg);
  mb.batch.loss_rows = vlm::supervised_rows(mb.batch.labels);
  mb.batch.image_rows = vlm::image_token_rows(mb.batch.input_ids, cfg.image_token_id);
  mb.batch.right_padded = true;  // nothing is padded
  return mb;
}

PaddingCount padding_count(const MicroBatch& mb) {
  PaddingCount c;
  c.tokens = mb.batch.input_ids.numel();
  c.padding = mb.filler ? c.tokens : c.tokens - mb.batch.attention_mask.sum().item<int64_t>();
  return c;
}

MicroBatch filler_micro_batch(int64_t pad_token_id) {
  MicroBatch mb;
  mb.filler = true;
  mb.batch.input_ids = torch::full({1, 1}, pad_token_id, torch::kLong);
  mb.batch.labels = torch::full({1, 1}, -100, torch::kLong);
  mb.batch.attention_mask = torch::ones({1, 1}, torch::kLong);
  mb.batch.position_ids = torch::zeros({3, 1, 1}, torch::kLong);
  mb.batch.loss_rows = torch::zeros({0}, torch::kLong);
  mb.batch.image_rows = torch::zeros({0}, torch::kLong);
  mb.batch.right_padded = true;
  return mb;
}

}  // namespace vlm::collate
