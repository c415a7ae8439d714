#include "data/pixel_pipeline.h"

#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

namespace {

// lut[c][v] = (float32(v * (1 / 255.0)) - float32(mean[c])) / float32(std[c]), every step
// rounded as HF's Pillow processor rounds it (rescale in float64 then cast to float32;
// normalise in float32), so the values are bit-identical to its pixel_values.
std::array<std::array<float, 256>, 3> normalize_lut(const PixelConfig& cfg) {
  std::array<std::array<float, 256>, 3> lut{};
  for (int c = 0; c < 3; ++c) {
    const float mean = static_cast<float>(cfg.mean[c]), stdv = static_cast<float>(cfg.std[c]);
    for (int v = 0; v < 256; ++v)
      lut[c][v] = (static_cast<float>(static_cast<double>(v) * (1.0 / 255.0)) - mean) / stdv;
  }
  return lut;
}

// ---- Pillow's Resample.c (ImagingResample, 8 bits per channel), transcribed.
constexpr int kPrecisionBits = 32 - 8 - 2;  // fixed-point weights: 22 fractional bits

double pil_bicubic(double x) {  // a = -0.5, support 2
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Weights of one axis (precompute_coeffs + normalize_coeffs_8bpc): output o reads inputs
// [bounds[2o], bounds[2o] + bounds[2o+1]) with weights kk[o * ksize + j] (fixed point).
struct PilCoeffs {
  int ksize = 0;
  std::vector<int> bounds;   // [n_out, 2]: first input, count
  std::vector<int32_t> kk;   // [n_out, ksize]
};

PilCoeffs pil_coeffs(int n_in, int n_out) {
  // Pillow: (double)(in1 - in0) / outSize with the box edges in float, box = (0, n_in).
  const double scale = static_cast<double>(static_cast<float>(n_in) - 0.0f) / n_out;
  const double filterscale = std::max(scale, 1.0);
  const double support = 2.0 * filterscale;
  PilCoeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(size_t(n_out) * 2);
  c.kk.assign(size_t(n_out) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int o = 0; o < n_out; ++o) {
    const double center = (o + 0.5) * scale, ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > n_in) xmax = n_in;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) ww += (k[x] = pil_bicubic((x + xmin - center + 0.5) * ss));
    for (int x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[x] / ww : k[x];
      c.kk[size_t(o) * c.ksize + x] = static_cast<int32_t>(
          w < 0 ? -0.5 + w * (1 << kPrecisionBits) : 0.5 + w * (1 << kPrecisionBits));
    }
    c.bounds[2 * o] = xmin;
    c.bounds[2 * o + 1] = xmax;
  }
  return c;
}

// Sums fit in int32 as in Pillow: |sum| <= 255 x sum |w| x 2^22 < 1.4e9.
inline uint8_t pil_clip8(int32_t v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

constexpr int32_t kHalf = 1 << (kPrecisionBits - 1);

// Horizontal pass: [h, w_in, 3] -> [h, w_out, 3].
cv::Mat pil_resample_horizontal(const cv::Mat& in, int w_out) {
  const PilCoeffs c = pil_coeffs(in.cols, w_out);
  cv::Mat out(in.rows, w_out, CV_8UC3);
  for (int y = 0; y < in.rows; ++y) {
    const uint8_t* src = in.ptr<uint8_t>(y);
    uint8_t* dst = out.ptr<uint8_t>(y);
    for (int o = 0; o < w_out; ++o, dst += 3) {
      const int32_t* k = &c.kk[size_t(o) * c.ksize];
      const uint8_t* s = src + 3 * c.bounds[2 * o];
      int32_t r = kHalf, g = kHalf, b = kHalf;
      for (int j = 0, n = c.bounds[2 * o + 1]; j < n; ++j, s += 3) {
        r += s[0] * k[j];
        g += s[1] * k[j];
        b += s[2] * k[j];
      }
      dst[0] = pil_clip8(r);
      dst[1] = pil_clip8(g);
      dst[2] = pil_clip8(b);
    }
  }
  return out;
}

// Vertical pass: [h_in, w, 3] -> [h_out, w, 3].
cv::Mat pil_resample_vertical(const cv::Mat& in, int h_out) {
  const PilCoeffs c = pil_coeffs(in.rows, h_out);
  const int n = in.cols * 3;
  cv::Mat out(h_out, in.cols, CV_8UC3);
  std::vector<int32_t> acc(static_cast<size_t>(n));
  for (int o = 0; o < h_out; ++o) {
    std::fill(acc.begin(), acc.end(), kHalf);
    const int32_t* k = &c.kk[size_t(o) * c.ksize];
    for (int j = 0; j < c.bounds[2 * o + 1]; ++j) {
      const uint8_t* s = in.ptr<uint8_t>(c.bounds[2 * o] + j);
      const int32_t w = k[j];
      for (int i = 0; i < n; ++i) acc[i] += s[i] * w;
    }
    uint8_t* dst = out.ptr<uint8_t>(o);
    for (int i = 0; i < n; ++i) dst[i] = pil_clip8(acc[i]);
  }
  return out;
}

}  // namespace

torch::Tensor normalize_rgb(const cv::Mat& rgb, const PixelConfig& cfg) {
  VLM_CHECK(rgb.type() == CV_8UC3, "normalize_rgb: expected an 8-bit RGB image (CV_8UC3), ",
            "got type ", rgb.type());
  const auto lut = normalize_lut(cfg);
  torch::Tensor out = torch::empty({rgb.rows, rgb.cols, 3}, torch::kFloat32);
  float* dst = out.data_ptr<float>();
  for (int y = 0; y < rgb.rows; ++y) {
    const uint8_t* src = rgb.ptr<uint8_t>(y);
    for (int64_t i = 0; i < int64_t(rgb.cols) * 3; ++i) *dst++ = lut[i % 3][src[i]];
  }
  return out;
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
  const auto lut = normalize_lut(cfg);
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
              for (int64_t px = 0; px < p; ++px) d[px] = lut[c][src[3 * px + c]];
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
  // As Image.resize: an axis whose size does not change is not resampled; horizontal first.
  cv::Mat x = rgb;
  if (width != x.cols) x = pil_resample_horizontal(x, static_cast<int>(width));
  if (height != x.rows) x = pil_resample_vertical(x, static_cast<int>(height));
  return x.data == rgb.data ? rgb.clone() : x;
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
  out.merge_size = cfg.geometry.merge_size;
  out.source_height = rgb.rows;
  out.source_width = rgb.cols;
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

namespace vlm::data {

PixelImage process_image_file(const std::string& path, const PixelConfig& cfg) {
  const cv::Mat rgb = decode_image_rgb(path);  // its errors name the path already
  try {
    return process_image(rgb, cfg);
  } catch (const vlm::Error& e) {
    throw vlm::Error(vlm::str("image '", path, "' (", rgb.rows, "x", rgb.cols,
                              " h x w, after EXIF orientation): ", e.what()));
  }
}

}  // namespace vlm::data
