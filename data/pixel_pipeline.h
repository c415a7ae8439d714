// Pixel pipeline: RGB uint8 image -> pixel_values [patches, C*T*p*p] float32 + grid_thw.
//
// Named sizes: p = patch side (14 Qwen2-VL / 2.5-VL, 16 Qwen3-VL), m = merge (2), T =
// temporal patch (2), factor = p*m (28 / 32); C*T*p*p = 1176 (p 14) or 1536 (p 16).
//
// Steps (spec section 2): bicubic resize to the target size (chosen by smart_resize or
// given by the step plan), scale 1/255, mean/std normalisation (the model's: CLIP for
// Qwen2, 0.5 for Qwen3), temporal duplication to T frames, patchify in the m x m
// merge-block order. Resize and normalisation round as HF's Pillow-based
// Qwen2VLImageProcessorPil does, so pixel_values are bit-identical to it for the same
// decoded RGB image (tests/data/image_hf_parity_test.cpp, docs/image_parity.md):
//   row r = ((bh * gw/m + bw) * m + mh) * m + mw   (patch at row m*bh+mh, col m*bw+mw)
//   col c = ((ch * T + tt) * p + py) * p + px
// The PixelConfig of a model (its family's processor defaults, its vision geometry and its
// preprocessor_config.json) comes from data/processor_config.h; the defaults here are
// Qwen2-VL's.
#pragma once
#include <opencv2/core.hpp>
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/pil_resample.h"
#include "vlm/model/image_geometry.h"

namespace vlm::data {

struct PixelConfig {
  vlm::VisionPatchGeometry geometry;           // default: patch 14, merge 2, temporal 2
  vlm::PixelLimits limits;                     // min/max pixels for smart_resize
  int64_t max_image_tokens = 0;                // per-image merged-token cap (0: none)
  // process_image_file only: decode a JPEG at 1/d of its size (libjpeg DCT scaling; d the
  // largest of 8, 4, 2 with source side >= d x resize target on both sides) before the
  // resize. Faster on large photos, but the pixels are no longer HF's (HF decodes at full
  // size; bench/RESULTS.md section 7 gives the difference), so it is off by default.
  bool jpeg_reduced_decode = false;
  // Mean / std as the processor config's (double) values; used as float32, the way HF's
  // processor rounds them. Default: CLIP's (Qwen2-VL, Qwen2.5-VL).
  std::array<double, 3> mean = {0.48145466, 0.4578275, 0.40821073};
  std::array<double, 3> std = {0.26862954, 0.26130258, 0.27577711};
  // Limits with the token cap applied (max_pixels = min(max_pixels, cap x factor^2)).
  vlm::PixelLimits effective_limits() const;
};

struct PixelImage {
  torch::Tensor pixel_values;          // [gt*gh*gw, C*T*p*p] = [patches, 1176 | 1536] float32
  std::array<int64_t, 3> grid_thw{};   // (t, gh, gw) in patch units
  int64_t merge_size = 2;              // m of the geometry it was patchified with
  int64_t source_height = 0;          // decoded image, before the resize
  int64_t source_width = 0;
  int64_t resized_height = 0;
  int64_t resized_width = 0;
  // LLM-side tokens: t*gh*gw / m^2.
  int64_t merged_tokens() const {
    return grid_thw[0] * grid_thw[1] * grid_thw[2] / (merge_size * merge_size);
  }
};

// image_hwc: [h, w, C] float32 (already normalised), h and w multiples of patch x merge.
// Duplicates the frame T times and returns [(h/p)*(w/p), C*T*p*p] in merge-block order.
torch::Tensor patchify(const torch::Tensor& image_hwc, const vlm::VisionPatchGeometry& g = {});

// resize_bicubic_aa (Pillow's bicubic, bit-identical): data/pil_resample.h.

// rgb: CV_8UC3, RGB order. Resized with resize_bicubic_aa to target_height x target_width
// (multiples of cfg.geometry.factor()), then normalised and patchified.
PixelImage process_image_to_size(const cv::Mat& rgb, int64_t target_height,
                                 int64_t target_width, const PixelConfig& cfg = {});

// As above with the target from smart_resize under cfg.effective_limits().
PixelImage process_image(const cv::Mat& rgb, const PixelConfig& cfg = {});

// Decodes the file (decode_image_rgb: EXIF orientation, alpha over white, 16-bit high byte)
// and processes it under cfg: the same steps the training loader takes (with
// cfg.jpeg_reduced_decode, a JPEG is decoded smaller first; the target size and grid stay
// those of the full-size image). Every error names
// the file and its decoded size (e.g. an aspect ratio above 200, which HF refuses too).
PixelImage process_image_file(const std::string& path, const PixelConfig& cfg = {});

// The JPEG scale denominator process_image_file decodes these bytes with: 1 unless
// cfg.jpeg_reduced_decode and the bytes are a JPEG whose resize target is at most 1/d of it
// on both sides, then the largest such d of 8, 4, 2.
int jpeg_decode_scale(const std::vector<uint8_t>& bytes, const PixelConfig& cfg);

// Fused normalise + temporal duplication + patchify of an RGB uint8 image whose sides are
// multiples of p*m (no resize): the same result as patchify(normalize_rgb(rgb)), one pass.
// returns [(h/p)*(w/p), C*T*p*p] float32.
torch::Tensor normalize_patchify_rgb(const cv::Mat& rgb, const PixelConfig& cfg = {});

// Normalised float image [h, w, 3] of an RGB uint8 Mat (no resize): (x/255 - mean)/std,
// rounded as HF's Pillow processor rounds it (x * (1/255) in float64 -> float32, then
// (x - mean) / std in float32).
torch::Tensor normalize_rgb(const cv::Mat& rgb, const PixelConfig& cfg = {});

}  // namespace vlm::data
