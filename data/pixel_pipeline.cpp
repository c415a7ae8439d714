#include "data/pixel_pipeline.h"

#include <opencv2/imgproc.hpp>

#include <cstring>

#include "data/image.h"
#include "vlm/check.h"

namespace vlm::data {

vlm::PixelLimits PixelConfig::effective_limits() const {
  return vlm::limits_with_token_cap(limits, max_image_tokens, geometry.factor());
}

torch::Tensor patchify(const torch::Tensor& image_hwc, const vlm::VisionPatchGeometry& g) {
  VLM_CHECK(image_hwc.dim() == 3, "patchify: expected [h, w, C], got ", image_hwc.sizes());
  const int64_t h = image_hwc.size(0), w = image_hwc.size(1), c = image_hwc.size(2);
  const int64_t p = g.patch_size, m = g.merge_size, T = g.temporal_patch_size;
  VLM_CHECK(h % (p * m) == 0 && w % (p * m) == 0, "patchify: expected sides that are ",
            "multiples of ", p * m, ", got ", h, "x", w, " (hint: resize with smart_resize)");
  const int64_t bh = h / (p * m), bw = w / (p * m);
  // [bh, mh, py, bw, mw, px, C] -> [bh, bw, mh, mw, C, py, px]
  torch::Tensor x = image_hwc.contiguous().view({bh, m, p, bw, m, p, c});
  x = x.permute({0, 3, 1, 4, 6, 2, 5});
  // Temporal duplication: insert T after C -> [bh, bw, mh, mw, C, T, py, px].
  x = x.unsqueeze(5).expand({bh, bw, m, m, c, T, p, p});
  return x.reshape({bh * bw * m * m, c * T * p * p}).contiguous();
}

torch::Tensor normalize_rgb(const cv::Mat& rgb, const PixelConfig& cfg) {
  VLM_CHECK(rgb.type() == CV_8UC3, "normalize_rgb: expected an 8-bit RGB image (CV_8UC3), ",
            "got type ", rgb.type());
  cv::Mat src = rgb.isContinuous() ? rgb : rgb.clone();
  torch::Tensor u8 = torch::from_blob(src.data, {src.rows, src.cols, 3}, torch::kUInt8);
  // (x / 255 - mean) / std  ==  x * (1 / (255 std)) - mean / std
  torch::Tensor scale = torch::empty({3}), shift = torch::empty({3});
  for (int k = 0; k < 3; ++k) {
    scale[k] = 1.0 / (255.0 * cfg.std[k]);
    shift[k] = -cfg.mean[k] / cfg.std[k];
  }
  return u8.to(torch::kFloat32).mul_(scale).add_(shift);
}

torch::Tensor normalize_patchify_rgb(const cv::Mat& rgb, const PixelConfig& cfg) {
  VLM_CHECK(rgb.type() == CV_8UC3, "normalize_patchify_rgb: expected an 8-bit RGB image ",
            "(CV_8UC3), got type ", rgb.type());
  const vlm::VisionPatchGeometry& g = cfg.geometry;
  const int64_t p = g.patch_size, m = g.merge_size, T = g.temporal_patch_size;
  const int64_t h = rgb.rows, w = rgb.cols;
  VLM_CHECK(h % (p * m) == 0 && w % (p * m) == 0, "normalize_patchify_rgb: expected sides ",
            "that are multiples of ", p * m, ", got ", h, "x", w);
  const int64_t bh = h / (p * m), bw = w / (p * m), cols = 3 * T * p * p;
  torch::Tensor out = torch::empty({bh * bw * m * m, cols}, torch::kFloat32);
  float* dst = out.data_ptr<float>();
  float scale[3], shift[3];
  for (int k = 0; k < 3; ++k) {
    scale[k] = float(1.0 / (255.0 * cfg.std[k]));
    shift[k] = float(-cfg.mean[k] / cfg.std[k]);
  }
  // Row r = ((by * bw + bx) * m + my) * m + mx; column ((c * T + t) * p + py) * p + px.
  for (int64_t by = 0; by < bh; ++by)
    for (int64_t bx = 0; bx < bw; ++bx)
      for (int64_t my = 0; my < m; ++my)
        for (int64_t mx = 0; mx < m; ++mx) {
          float* row = dst + (((by * bw + bx) * m + my) * m + mx) * cols;
          const int64_t y0 = (by * m + my) * p, x0 = (bx * m + mx) * p;
          for (int64_t py = 0; py < p; ++py) {
            const uint8_t* src = rgb.ptr<uint8_t>(int(y0 + py)) + 3 * x0;
            for (int64_t c = 0; c < 3; ++c) {
              float* d = row + (c * T * p + py) * p;
              for (int64_t px = 0; px < p; ++px) d[px] = src[3 * px + c] * scale[c] + shift[c];
              for (int64_t t = 1; t < T; ++t) std::copy(d, d + p, d + t * p * p);
            }
          }
        }
  return out;
}

cv::Mat resize_bicubic_aa(const cv::Mat& rgb, int64_t height, int64_t width) {
  VLM_CHECK(rgb.type() == CV_8UC3, "resize_bicubic_aa: expected an 8-bit RGB image (CV_8UC3), got type ",
            rgb.type());
  VLM_CHECK(height > 0 && width > 0, "resize_bicubic_aa: target ", height, "x", width, " is empty");
  cv::Mat src = rgb.isContinuous() ? rgb : rgb.clone();
  torch::NoGradGuard no_grad;
  auto x = torch::from_blob(src.data, {src.rows, src.cols, 3}, torch::kUInt8)
               .permute({2, 0, 1})
               .unsqueeze(0)
               .to(torch::kFloat32);  // [1, 3, H, W]
  // One axis at a time, rounded to 8 bits in between, as PIL does (the other axis keeps its
  // size, where the bicubic kernel is the identity).
  auto pass = [](const torch::Tensor& t, int64_t h, int64_t w) {
    std::vector<int64_t> size = {h, w};
    return at::_upsample_bicubic2d_aa(t, at::IntArrayRef(size), /*align_corners=*/false,
                                      c10::optional<double>(), c10::optional<double>())
        .round_()
        .clamp_(0, 255);
  };
  if (width != src.cols) x = pass(x, src.rows, width);
  if (height != src.rows) x = pass(x, height, width);
  auto bytes = x.to(torch::kUInt8)[0].permute({1, 2, 0}).contiguous();  // [height, width, 3]
  cv::Mat result(static_cast<int>(height), static_cast<int>(width), CV_8UC3);
  std::memcpy(result.data, bytes.data_ptr<uint8_t>(), static_cast<size_t>(height * width * 3));
  return result;
}

PixelImage process_image_to_size(const cv::Mat& rgb, int64_t target_height,
                                 int64_t target_width, const PixelConfig& cfg) {
  VLM_CHECK(!rgb.empty(), "process_image: empty image");
  const int64_t f = cfg.geometry.factor();
  VLM_CHECK(target_height > 0 && target_width > 0 && target_height % f == 0 &&
                target_width % f == 0,
            "process_image: target size must be positive multiples of ", f, ", got ",
            target_height, "x", target_width);
  VLM_CHECK(target_width <= kMaxImagePixels / target_height, "process_image: target size ", target_height,
            "x", target_width, " is more than ", kMaxImagePixels,
            " pixels (hint: cap the image with data.max_pixels / max_image_tokens)");
  cv::Mat resized;
  if (rgb.rows == target_height && rgb.cols == target_width) {
    resized = rgb;
  } else {
    resized = resize_bicubic_aa(rgb, target_height, target_width);
  }
  PixelImage out;
  out.pixel_values = normalize_patchify_rgb(resized, cfg);
  out.grid_thw = vlm::image_grid_thw(target_height, target_width, cfg.geometry);
  out.resized_height = target_height;
  out.resized_width = target_width;
  return out;
}

PixelImage process_image(const cv::Mat& rgb, const PixelConfig& cfg) {
  vlm::ImageSize s = vlm::smart_resize(rgb.rows, rgb.cols, cfg.effective_limits(),
                                       cfg.geometry.factor());
  return process_image_to_size(rgb, s.height, s.width, cfg);
}

}  // namespace vlm::data
