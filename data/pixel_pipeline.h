// Pixel pipeline: RGB uint8 image -> pixel_values [patches, 1176] float32 + grid_thw.
//
// Steps (spec section 2): bicubic resize to the target size (chosen by smart_resize or
// given by the step plan), scale 1/255, CLIP mean/std normalisation, temporal duplication
// to 2 frames, patchify in the 2x2 merge-block order:
//   row r = ((bh * gw/2 + bw) * 2 + mh) * 2 + mw   (patch at row 2bh+mh, col 2bw+mw)
//   col c = ((ch * 2 + tt) * 14 + py) * 14 + px
#pragma once
#include <opencv2/core.hpp>
#include <torch/torch.h>

#include <array>
#include <cstdint>

#include "vlm/image_geometry.h"

namespace vlm::data {

struct PixelConfig {
  vlm::VisionPatchGeometry geometry;           // patch 14, merge 2, temporal 2
  vlm::PixelLimits limits;                     // min/max pixels for smart_resize
  int64_t max_image_tokens = 0;                // per-image merged-token cap (0: none)
  std::array<float, 3> mean = {0.48145466f, 0.4578275f, 0.40821073f};  // CLIP
  std::array<float, 3> std = {0.26862954f, 0.26130258f, 0.27577711f};
  // Limits with the token cap applied (max_pixels = min(max_pixels, cap x 784)).
  vlm::PixelLimits effective_limits() const;
};

struct PixelImage {
  torch::Tensor pixel_values;          // [gt*gh*gw, C*T*p*p] = [patches, 1176] float32
  std::array<int64_t, 3> grid_thw{};   // (t, gh, gw) in patch units
  int64_t resized_height = 0;
  int64_t resized_width = 0;
  int64_t merged_tokens() const { return grid_thw[0] * grid_thw[1] * grid_thw[2] / 4; }
};

// image_hwc: [h, w, C] float32 (already normalised), h and w multiples of patch x merge.
// Duplicates the frame T times and returns [(h/p)*(w/p), C*T*p*p] in merge-block order.
torch::Tensor patchify(const torch::Tensor& image_hwc, const vlm::VisionPatchGeometry& g = {});

// rgb: CV_8UC3, RGB order. Resized with resize_bicubic_aa to target_height x target_width
// (multiples of 28), then normalised and patchified.
// Bicubic resize of an 8-bit RGB image as PIL's Image.resize(BICUBIC) computes it (the
// reference processor's resize): kernel a = -0.5, antialiased when shrinking (the kernel
// widens by the scale factor), a horizontal pass then a vertical pass, each rounded and
// clamped to 8 bits. Each pass is LibTorch's _upsample_bicubic2d_aa along one axis.
// OpenCV's INTER_CUBIC does not antialias and aliases badly on large downscales.
// rgb: CV_8UC3 [H, W] -> CV_8UC3 [height, width].
cv::Mat resize_bicubic_aa(const cv::Mat& rgb, int64_t height, int64_t width);

PixelImage process_image_to_size(const cv::Mat& rgb, int64_t target_height,
                                 int64_t target_width, const PixelConfig& cfg = {});

// As above with the target from smart_resize under cfg.effective_limits().
PixelImage process_image(const cv::Mat& rgb, const PixelConfig& cfg = {});

// Fused normalise + temporal duplication + patchify of an RGB uint8 image whose sides are
// multiples of 28 (no resize): the same result as patchify(normalize_rgb(rgb)), one pass.
// returns [(h/14)*(w/14), 1176] float32.
torch::Tensor normalize_patchify_rgb(const cv::Mat& rgb, const PixelConfig& cfg = {});

// Normalised float image [h, w, 3] of an RGB uint8 Mat (no resize): (x/255 - mean)/std.
torch::Tensor normalize_rgb(const cv::Mat& rgb, const PixelConfig& cfg = {});

}  // namespace vlm::data
