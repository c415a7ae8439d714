#include "vlm/model/image_geometry.h"

#include <algorithm>
#include <cmath>

#include "vlm/runtime/check.h"

namespace vlm {
namespace {

// Python's round(): half to even. nearbyint uses the current rounding mode, which is
// round-to-nearest-even unless someone changed it; we do not rely on that.
double round_half_even(double x) {
  double f = std::floor(x);
  double diff = x - f;
  if (diff > 0.5) return f + 1.0;
  if (diff < 0.5) return f;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}

}  // namespace

ImageSize smart_resize(int64_t height, int64_t width, const PixelLimits& limits,
                       int64_t factor) {
  VLM_CHECK(height > 0 && width > 0, "smart_resize: expected a non-empty image, got ",
            height, "x", width, " (hint: the file may be corrupt or zero-size)");
  VLM_CHECK(factor > 0, "smart_resize: factor must be positive, got ", factor);
  VLM_CHECK(limits.min_pixels <= limits.max_pixels, "smart_resize: expected min_pixels <= ",
            "max_pixels, got ", limits.min_pixels, " > ", limits.max_pixels,
            " (hint: raise max_pixels / max_image_tokens or lower min_pixels)");
  const double H = static_cast<double>(height), W = static_cast<double>(width);
  const double aspect = std::max(H, W) / std::min(H, W);
  VLM_CHECK(aspect <= kMaxAspectRatio, "smart_resize: expected aspect ratio <= ",
            kMaxAspectRatio, ", got ", aspect, " for ", height, "x", width,
            " (hint: crop or split the image)");
  const double f = static_cast<double>(factor);
  int64_t h = static_cast<int64_t>(round_half_even(H / f)) * factor;
  int64_t w = static_cast<int64_t>(round_half_even(W / f)) * factor;
  if (h * w > limits.max_pixels) {
    const double beta = std::sqrt(H * W / static_cast<double>(limits.max_pixels));
    h = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(H / beta / f)) * factor);
    w = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(W / beta / f)) * factor);
  } else if (h * w < limits.min_pixels) {
    const double beta = std::sqrt(static_cast<double>(limits.min_pixels) / (H * W));
    h = static_cast<int64_t>(std::ceil(H * beta / f)) * factor;
    w = static_cast<int64_t>(std::ceil(W * beta / f)) * factor;
  }
  return {h, w};
}

int64_t merged_tokens(int64_t height, int64_t width, int64_t factor) {
  VLM_CHECK(height % factor == 0 && width % factor == 0, "merged_tokens: expected sides ",
            "that are multiples of ", factor, ", got ", height, "x", width,
            " (hint: pass the size returned by smart_resize)");
  return (height / factor) * (width / factor);
}

int64_t image_tokens(int64_t height, int64_t width, const PixelLimits& limits,
                     int64_t factor) {
  ImageSize s = smart_resize(height, width, limits, factor);
  return merged_tokens(s.height, s.width, factor);
}

int64_t max_pixels_for_tokens(int64_t tokens, int64_t factor) {
  VLM_CHECK(tokens > 0, "max_image_tokens must be positive, got ", tokens);
  return tokens * factor * factor;
}

PixelLimits limits_with_token_cap(const PixelLimits& limits, int64_t max_image_tokens,
                                  int64_t factor) {
  PixelLimits out = limits;
  if (max_image_tokens <= 0) return out;
  out.max_pixels = std::min(limits.max_pixels, max_pixels_for_tokens(max_image_tokens, factor));
  VLM_CHECK(out.max_pixels >= out.min_pixels, "max_image_tokens ", max_image_tokens,
            " gives max_pixels ", out.max_pixels, " below min_pixels ", out.min_pixels,
            " (hint: raise data.max_image_tokens to at least ",
            (out.min_pixels + factor * factor - 1) / (factor * factor), ")");
  return out;
}

std::array<int64_t, 3> image_grid_thw(int64_t height, int64_t width,
                                      const VisionPatchGeometry& g) {
  VLM_CHECK(height % g.factor() == 0 && width % g.factor() == 0,
            "image_grid_thw: expected sides that are multiples of ", g.factor(), ", got ",
            height, "x", width, " (hint: pass the size returned by smart_resize)");
  return {1, height / g.patch_size, width / g.patch_size};
}

}  // namespace vlm
