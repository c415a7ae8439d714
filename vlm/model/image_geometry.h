// Image geometry of Qwen-VL preprocessing: pure integer/float math, no pixels.
//
// smart_resize picks the resized (height, width) of an image exactly as the reference
// image processor does (spec section 2): both sides multiples of factor = patch x merge
// (28 for Qwen2-VL / 2.5-VL, 32 for Qwen3-VL), round-half-to-even, total pixels inside
// [min_pixels, max_pixels], aspect <= 200. The `factor` defaults below are Qwen2-VL's;
// callers that serve any model pass the model's (VisionPatchGeometry::factor()).
// Capping merged image tokens is the same as choosing max_pixels = cap x factor^2.
// data/ (the pixel pipeline) and collate/ (the step plan, which assigns each image its
// pixel budget before anything is decoded) both use these functions.
#pragma once
#include <array>
#include <cstdint>

namespace vlm {

// The patch geometry of a vision tower (defaults: Qwen2-VL's; Qwen3-VL has patch 16).
struct VisionPatchGeometry {
  int64_t patch_size = 14;           // pixels per patch side
  int64_t merge_size = 2;            // patches per merged-token side
  int64_t temporal_patch_size = 2;   // frames per temporal patch (images are duplicated)
  int64_t factor() const { return patch_size * merge_size; }  // 28 (Qwen2), 32 (Qwen3)
  int64_t merge_unit() const { return merge_size * merge_size; }  // patches per merged token
};

// Pixel limits of smart_resize; defaults are Qwen2-VL's hub preprocessor_config.json values.
struct PixelLimits {
  int64_t min_pixels = 3136;       // 56 x 56
  int64_t max_pixels = 12845056;   // 28 x 28 x 16384
};

struct ImageSize {
  int64_t height = 0;
  int64_t width = 0;
};

// Largest aspect ratio (long side / short side) the reference accepts.
constexpr double kMaxAspectRatio = 200.0;

// Resized size for an image of height x width (oriented, in pixels). Throws vlm::Error for
// a zero-size image, an aspect ratio above kMaxAspectRatio, or min_pixels > max_pixels.
// Step 3 (too many pixels) clamps each side to >= factor, as newer reference versions do;
// for very elongated images that clamp can exceed max_pixels (one row of merged tokens),
// so callers budget with the returned size (image_tokens), not with max_pixels.
ImageSize smart_resize(int64_t height, int64_t width, const PixelLimits& limits = {},
                       int64_t factor = 28);

// Merged (LLM-side) tokens of an image resized to height x width (both multiples of
// factor): (height / factor) * (width / factor).
int64_t merged_tokens(int64_t height, int64_t width, int64_t factor = 28);

// Merged tokens of an original-size image after smart_resize under `limits`.
int64_t image_tokens(int64_t height, int64_t width, const PixelLimits& limits = {},
                     int64_t factor = 28);

// max_pixels equivalent to a cap of `tokens` merged tokens per image: tokens x factor^2.
int64_t max_pixels_for_tokens(int64_t tokens, int64_t factor = 28);

// Limits with max_pixels lowered to a per-image token cap (cap <= 0: no cap). Throws if
// the cap would push max_pixels below min_pixels.
PixelLimits limits_with_token_cap(const PixelLimits& limits, int64_t max_image_tokens,
                                  int64_t factor = 28);

// grid_thw in patch units of one image resized to height x width: (1, h/p, w/p).
std::array<int64_t, 3> image_grid_thw(int64_t height, int64_t width,
                                      const VisionPatchGeometry& g = {});

}  // namespace vlm
