// Rotary position embeddings: the vision tower's 2D rotary (row/column angles in
// merge-block order) and the LLM's multimodal M-RoPE (3 position streams: T, H, W).
// Both use the NeoX layout: dim j is rotated with dim j + D/2 (rotate_half).
#pragma once
#include <torch/torch.h>

#include <vector>

namespace vlm {

struct CosSin {
  torch::Tensor cos, sin;
};

// [..., D] -> cat(-x[..., D/2:], x[..., :D/2])
torch::Tensor rotate_half(const torch::Tensor& x);
// x * cos + rotate_half(x) * sin, with cos/sin broadcast against x.
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// apply_rotary on the first cos.size(-1) dims of x; the rest pass unchanged (partial rotary,
// Qwen3.5: a quarter of each head).
torch::Tensor apply_partial_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// inv_freq_k = theta^(-2k/dim), k = 0..dim/2-1, fp32 (computed as HF does), built on
// `device` (no host -> device copy).
torch::Tensor rotary_inv_freq(int64_t dim, double theta, torch::Device device = torch::kCPU);

// Vision rotary ids: for each image (t, gh, gw) of grid_thw [N,3] the (row, col) of every
// patch in merge-block order (2x2 blocks in raster order, each TL, TR, BL, BR), repeated t
// times. Returns [S, 2] int64, S = sum t*gh*gw.
torch::Tensor vision_rotary_pos_ids(const torch::Tensor& grid_thw, int64_t merge);

// Vision rotary table for head_dim: angles [S, head_dim/2] = [row * inv_freq, col * inv_freq]
// with inv_freq = 10000^(-2k/(head_dim/2)); returns cos/sin of cat(angles, angles):
// [S, head_dim] fp32 on `device`.
CosSin vision_rotary(const torch::Tensor& grid_thw, int64_t head_dim, int64_t merge,
                     torch::Device device, double theta = 10000.0);

// M-RoPE cos/sin: position_ids [3, B, L] -> cos/sin [B, L, head_dim] in `dtype`.
// Frequency k (and k + head_dim/2) takes its angle from stream s where
// mrope_section = [nT, nH, nW] splits k = 0..head_dim/2-1 into consecutive ranges
// (Qwen2), or, interleaved (Qwen3), k takes H when k % 3 == 1 and k < 3 nH, W when
// k % 3 == 2 and k < 3 nW, else T.
// Angles, cos and sin are computed in fp32 and then cast to `dtype`.
CosSin mrope_cos_sin(const torch::Tensor& position_ids, int64_t head_dim, double theta,
                     const std::vector<int64_t>& mrope_section, torch::Dtype dtype,
                     bool interleaved = false);

}  // namespace vlm
