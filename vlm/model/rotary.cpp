#include "vlm/model/rotary.h"

#include <algorithm>

#include "vlm/runtime/check.h"
#include "vlm/runtime/device_staging.h"

namespace vlm {

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;
}

torch::Tensor apply_partial_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t r = cos.size(-1), d = x.size(-1);
  if (r == d) return apply_rotary(x, cos, sin);
  return torch::cat({apply_rotary(x.narrow(-1, 0, r), cos, sin), x.narrow(-1, r, d - r)}, -1);
}

torch::Tensor rotary_inv_freq(int64_t dim, double theta, torch::Device device) {
  auto exponent = torch::arange(0, dim, 2, torch::TensorOptions().dtype(torch::kInt64).device(device))
                      .to(torch::kFloat32) /
                  static_cast<double>(dim);
  return 1.0 / torch::pow(theta, exponent);
}

torch::Tensor vision_rotary_pos_ids(const torch::Tensor& grid_thw, int64_t merge) {
  VLM_CHECK(grid_thw.dim() == 2 && grid_thw.size(1) == 3, "image_grid_thw: expected [N, 3], got ",
            grid_thw.sizes());
  auto g = grid_thw.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* d = g.data_ptr<int64_t>();
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < g.size(0); ++i) {
    const int64_t t = d[3 * i], h = d[3 * i + 1], w = d[3 * i + 2];
    VLM_CHECK(h % merge == 0 && w % merge == 0, "image_grid_thw row ", i, ": grid ", h, "x", w,
              " is not divisible by spatial_merge_size ", merge);
    for (int64_t tt = 0; tt < t; ++tt)
      for (int64_t bh = 0; bh < h / merge; ++bh)
        for (int64_t bw = 0; bw < w / merge; ++bw)
          for (int64_t mh = 0; mh < merge; ++mh)
            for (int64_t mw = 0; mw < merge; ++mw) {
              ids.push_back(bh * merge + mh);
              ids.push_back(bw * merge + mw);
            }
  }
  const int64_t n = static_cast<int64_t>(ids.size()) / 2;
  return torch::from_blob(ids.data(), {n, 2}, torch::kInt64).clone();
}

CosSin vision_rotary(const torch::Tensor& grid_thw, int64_t head_dim, int64_t merge,
                     torch::Device device, double theta) {
  // The integer positions travel (pinned, non-blocking); the angles are computed on the device.
  auto pos = stage_to_device(vision_rotary_pos_ids(grid_thw, merge), device, torch::kFloat32);  // [S, 2]
  auto inv = rotary_inv_freq(head_dim / 2, theta, device);                 // [head_dim/4]
  auto angles = torch::cat({pos.select(1, 0).unsqueeze(1) * inv, pos.select(1, 1).unsqueeze(1) * inv},
                           1);                                             // [S, head_dim/2]
  auto emb = torch::cat({angles, angles}, 1);                              // [S, head_dim]
  return {emb.cos(), emb.sin()};
}

CosSin mrope_cos_sin(const torch::Tensor& position_ids, int64_t head_dim, double theta,
                     const std::vector<int64_t>& mrope_section, torch::Dtype dtype, bool interleaved) {
  VLM_CHECK(position_ids.dim() == 3 && position_ids.size(0) == 3,
            "position_ids: expected [3, B, L], got ", position_ids.sizes());
  const int64_t half = head_dim / 2;
  auto inv = rotary_inv_freq(head_dim, theta, position_ids.device());     // [half]
  auto freqs = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv;       // [3, B, L, half]
  if (interleaved) {
    VLM_CHECK(mrope_section.size() == 3, "mrope_section: expected 3 entries, got ", mrope_section.size());
    auto sel = freqs[0].clone();  // [B, L, half]: T everywhere, then H and W at their slots
    for (int64_t s = 1; s <= 2; ++s) {
      const int64_t end = std::min(3 * mrope_section[size_t(s)], half);  // slots s, s+3, ... < end
      if (end <= s) continue;
      auto idx = torch::arange(s, end, 3, torch::TensorOptions().dtype(torch::kInt64).device(freqs.device()));
      sel.index_copy_(-1, idx, freqs[s].index_select(-1, idx));
    }
    auto emb = torch::cat({sel, sel}, -1);  // [B, L, head_dim]
    return {emb.cos().to(dtype), emb.sin().to(dtype)};
  }
  std::vector<torch::Tensor> parts;
  int64_t k0 = 0;
  for (size_t s = 0; s < mrope_section.size(); ++s) {
    parts.push_back(freqs[static_cast<int64_t>(s)].narrow(-1, k0, mrope_section[s]));
    k0 += mrope_section[s];
  }
  VLM_CHECK(k0 == half, "mrope_section sums to ", k0, ", expected head_dim/2 = ", half);
  auto sel = torch::cat(parts, -1);             // [B, L, half]
  auto emb = torch::cat({sel, sel}, -1);        // [B, L, head_dim]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

}  // namespace vlm
