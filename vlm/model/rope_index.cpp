#include "vlm/model/rope_index.h"

#include <algorithm>

#include "vlm/runtime/check.h"

namespace vlm {

RopeIndex get_rope_index(const torch::Tensor& input_ids, const torch::Tensor& image_grid_thw,
                         const torch::Tensor& attention_mask, const VlmConfig& cfg) {
  VLM_CHECK(input_ids.dim() == 2, "input_ids: expected [B, L], got ", input_ids.sizes());
  const int64_t b = input_ids.size(0), l = input_ids.size(1);
  auto ids = input_ids.to(torch::kCPU, torch::kInt64).contiguous();
  auto am = attention_mask.defined() ? attention_mask.to(torch::kCPU, torch::kInt64).contiguous()
                                     : torch::ones({b, l}, torch::kInt64);
  VLM_CHECK(am.sizes() == ids.sizes(), "attention_mask ", am.sizes(), " must match input_ids ", ids.sizes());
  torch::Tensor grid = image_grid_thw.defined() ? image_grid_thw.to(torch::kCPU, torch::kInt64).contiguous()
                                                : torch::zeros({0, 3}, torch::kInt64);
  const int64_t n_images = grid.size(0);
  const int64_t merge = cfg.vision.spatial_merge_size;
  auto pos = torch::ones({3, b, l}, torch::kInt64);
  auto deltas = torch::zeros({b, 1}, torch::kInt64);
  auto P = pos.accessor<int64_t, 3>();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* m = am.data_ptr<int64_t>();
  const int64_t* g = grid.data_ptr<int64_t>();
  int64_t image = 0;
  for (int64_t s = 0; s < b; ++s) {
    std::vector<int64_t> real;  // indices of unmasked tokens
    for (int64_t j = 0; j < l; ++j)
      if (m[s * l + j] != 0) real.push_back(j);
    int64_t next = 0;  // max position so far + 1
    size_t k = 0;
    while (k < real.size()) {
      const int64_t j = real[k];
      const bool pad = id[s * l + j] == cfg.image_token_id;
      const bool opens = pad && k > 0 && id[s * l + real[k - 1]] == cfg.vision_start_token_id;
      VLM_CHECK(!pad || opens, "sequence ", s, ", position ", j, ": <|image_pad|> (id ", cfg.image_token_id,
                ") that neither follows <|vision_start|> (id ", cfg.vision_start_token_id,
                ") nor belongs to the image block before it (hint: an image is <|vision_start|> then "
                "t*gh*gw/", merge * merge, " pads from its grid; a pad elsewhere, e.g. typed in the "
                "text or one too many, has no image behind it)");
      if (!opens) {
        for (int c = 0; c < 3; ++c) P[c][s][j] = next;
        ++next;
        ++k;
        continue;
      }
      VLM_CHECK(image < n_images, "sequence ", s, " has more image blocks than image_grid_thw rows (",
                n_images, ")");
      const int64_t t = g[3 * image], hh = g[3 * image + 1] / merge, ww = g[3 * image + 2] / merge;
      const int64_t n = t * hh * ww;
      int64_t run = 0;
      while (k + run < real.size() && run < n && id[s * l + real[k + run]] == cfg.image_token_id) ++run;
      VLM_CHECK(run == n, "sequence ", s, ": image ", image, " (grid ", t, "x", g[3 * image + 1], "x",
                g[3 * image + 2], ") needs ", n, " image tokens after <|vision_start|> but has ", run,
                " (hint: expand each image placeholder to t*gh*gw/", merge * merge, " tokens)");
      int64_t max_off = 0;
      for (int64_t tt = 0; tt < t; ++tt)
        for (int64_t r = 0; r < hh; ++r)
          for (int64_t c = 0; c < ww; ++c) {
            const int64_t jj = real[k++];
            const int64_t ti = cfg.text.image_frames_advance_time ? tt : 0;
            P[0][s][jj] = next + ti;
            P[1][s][jj] = next + r;
            P[2][s][jj] = next + c;
            max_off = std::max({max_off, ti, r, c});
          }
      next += max_off + 1;
      ++image;
    }
    deltas[s][0] = next - l;
  }
  VLM_CHECK(image == n_images, "image_grid_thw has ", n_images, " rows but the input_ids hold ", image,
            " image blocks (hint: every image needs its run of <|image_pad|> tokens)");
  return {pos.to(input_ids.device()), deltas.to(input_ids.device())};
}

torch::Tensor packed_position_ids(const torch::Tensor& input_ids, const torch::Tensor& image_grid_thw,
                                  const std::vector<int64_t>& cu, const VlmConfig& cfg) {
  VLM_CHECK(input_ids.dim() == 2 && input_ids.size(0) == 1, "packed input_ids: expected [1, L], got ",
            input_ids.sizes());
  const int64_t l = input_ids.size(1);
  VLM_CHECK(cu.size() >= 2 && cu.front() == 0 && cu.back() == l, "text cu_seqlens must run from 0 to ", l,
            " (the packed length), got ", cu.size(), " entries ending at ", cu.empty() ? -1 : cu.back());
  auto ids = input_ids.to(torch::kCPU, torch::kInt64).contiguous();
  torch::Tensor grid = image_grid_thw.defined() ? image_grid_thw.to(torch::kCPU, torch::kInt64).contiguous()
                                                : torch::zeros({0, 3}, torch::kInt64);
  const int64_t unit = cfg.vision.spatial_merge_size * cfg.vision.spatial_merge_size;
  std::vector<torch::Tensor> parts;
  int64_t row = 0;  // next image_grid_thw row
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    const int64_t len = cu[i + 1] - cu[i];
    VLM_CHECK(len > 0, "text cu_seqlens: segment ", i, " is empty (entries must increase)");
    auto seg = ids.narrow(1, cu[i], len);
    // This segment's images: grid rows whose tokens add up to its image pads.
    const int64_t pads = (seg == cfg.image_token_id).sum().item<int64_t>();
    int64_t first = row, taken = 0;
    while (taken < pads && row < grid.size(0)) {
      taken += grid[row][0].item<int64_t>() * grid[row][1].item<int64_t>() * grid[row][2].item<int64_t>() / unit;
      ++row;
    }
    VLM_CHECK(taken == pads, "packed segment ", i, " has ", pads, " image tokens but the remaining image grids give ",
              taken, " (hint: image_grid_thw must list every segment's images in order)");
    auto g = row > first ? grid.narrow(0, first, row - first) : torch::Tensor();
    parts.push_back(get_rope_index(seg, g, torch::Tensor(), cfg).position_ids);  // [3, 1, len]
  }
  VLM_CHECK(row == grid.size(0), "image_grid_thw has ", grid.size(0), " rows but the packed segments use ", row);
  return torch::cat(parts, 2).to(input_ids.device());
}

}  // namespace vlm
