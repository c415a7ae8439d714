// Placing rows of one tensor at known rows of another, differentiably, with fixed shapes in
// forward and backward (no host sync on a GPU) and nothing saved for backward but the row
// index. The image features go to the image pad positions this way, and Qwen3-VL's
// DeepStack features are added there; HF uses masked_scatter (whose backward is a
// masked_select: a data-dependent shape) and index_copy would keep the features alive until
// backward (its derivative saves `source`).
#pragma once
#include <torch/torch.h>

namespace vlm {

// base: [N, d], rows: [M] int64 distinct, on base's device, src: [M, d] -> [N, d]:
// base with row rows[i] replaced by src[i]. Gradients: base's grad with those rows zeroed,
// src's = grad[rows].
torch::Tensor replace_rows(const torch::Tensor& base, const torch::Tensor& rows, const torch::Tensor& src);

// The same with src added to those rows. Gradients: base's = grad, src's = grad[rows].
torch::Tensor add_rows(const torch::Tensor& base, const torch::Tensor& rows, const torch::Tensor& src);

}  // namespace vlm
