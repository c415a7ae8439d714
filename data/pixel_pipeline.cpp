#include "data/pixel_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "data/image.h"
#include "vlm/runtime/check.h"

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

}  // namespace

namespace {

// [rows, cols] float32, uninitialised. A large pixel_values often comes back from glibc as
// fresh pages: from 32 MiB glibc maps and unmaps every block (even as vlm/runtime/host_malloc.h tunes
// it), and below that, in image_file_bench, a 26 MB buffer still faulted all its pages on
// every call (5k faults, about 12 ms). Buffers from 16 MiB are therefore mapped here with
// MADV_HUGEPAGE: 2 MiB pages where the kernel allows them (THP "madvise" or "always"), 512x
// fewer faults, a predictable cost (the kernel zeroing them, about 2 ms for 19 MB here);
// without THP they behave as before.
torch::Tensor empty_pixels(int64_t rows, int64_t cols) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr size_t kHuge = size_t(2) << 20, kMapFrom = size_t(16) << 20;
  const size_t bytes = size_t(rows) * size_t(cols) * sizeof(float);
  if (bytes >= kMapFrom) {
    const size_t len = bytes + kHuge;  // room to align the start to 2 MiB
    void* base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base != MAP_FAILED) {
      const uintptr_t start = (reinterpret_cast<uintptr_t>(base) + kHuge - 1) & ~(kHuge - 1);
      madvise(reinterpret_cast<void*>(start), bytes, MADV_HUGEPAGE);  // a hint: errors ignored
      return torch::from_blob(
          reinterpret_cast<void*>(start), {rows, cols}, [base, len](void*) { munmap(base, len); },
          torch::TensorOptions().dtype(torch::kFloat32));
    }
  }
#endif
  return torch::empty({rows, cols}, torch::kFloat32);
}

// dst[0, n) = src[0, n) with streaming (non-temporal) stores where SSE is available and dst
// is 16-byte aligned: pixel_values is written once and is larger than the caches.
inline void copy_stream(float* dst, const float* src, int64_t n) {
#if defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
    for (; i < n; ++i) dst[i] = src[i];
    return;
  }
#endif
  std::memcpy(dst, src, size_t(n) * sizeof(float));
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
  const int64_t bh = h / (p * m), bw = w / (p * m), pp = p * p, cols = 3 * T * pp;
  torch::Tensor out = empty_pixels(bh * bw * m * m, cols);
  float* dst = out.data_ptr<float>();
  const auto lut = normalize_lut(cfg);
  std::vector<float> block(static_cast<size_t>(3 * pp));  // one patch, [C, p, p]
  // Row r = ((by * bw + bx) * m + my) * m + mx; column ((c * T + t) * p + py) * p + px. Each
  // patch is gathered into `block` once, then written as 3 x T contiguous runs of p*p.
  for (int64_t by = 0; by < bh; ++by)
    for (int64_t bx = 0; bx < bw; ++bx)
      for (int64_t my = 0; my < m; ++my)
        for (int64_t mx = 0; mx < m; ++mx) {
          float* row = dst + (((by * bw + bx) * m + my) * m + mx) * cols;
          const int64_t y0 = (by * m + my) * p, x0 = (bx * m + mx) * p;
          for (int64_t py = 0; py < p; ++py) {
            const uint8_t* src = rgb.ptr<uint8_t>(int(y0 + py)) + 3 * x0;
            float* b0 = block.data() + py * p;
            for (int64_t px = 0; px < p; ++px, src += 3) {
              b0[px] = lut[0][src[0]];
              b0[pp + px] = lut[1][src[1]];
              b0[2 * pp + px] = lut[2][src[2]];
            }
          }
          for (int64_t c = 0; c < 3; ++c)
            for (int64_t t = 0; t < T; ++t)
              copy_stream(row + (c * T + t) * pp, block.data() + c * pp, pp);
        }
#if defined(__SSE2__)
  _mm_sfence();  // the streaming stores are visible before the tensor leaves this thread
#endif
  return out;
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

// 1, 2, 4 or 8: the largest JPEG DCT scale whose output still covers the resize target of the
// full-size image on both sides (1 when the bytes are not a JPEG or reduced decoding is off).
int jpeg_decode_scale(const std::vector<uint8_t>& bytes, const PixelConfig& cfg) {
  if (!cfg.jpeg_reduced_decode) return 1;
  const std::optional<ImageInfo> info = parse_image_header(bytes);
  if (!info || info->format != "jpeg" || info->width <= 0 || info->height <= 0) return 1;
  const vlm::ImageSize s = vlm::smart_resize(info->height, info->width, cfg.effective_limits(),
                                             cfg.geometry.factor());
  for (int d : {8, 4, 2})  // the target is at most 1/d of the source on both sides
    if (info->height >= s.height * d && info->width >= s.width * d) return d;
  return 1;
}

PixelImage process_image_file(const std::string& path, const PixelConfig& cfg) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  const int denom = jpeg_decode_scale(bytes, cfg);
  const cv::Mat rgb = decode_image_rgb(bytes, path, denom);  // its errors name the path
  try {
    if (denom > 1) {  // the target of the full-size image, as HF computes it
      const ImageInfo info = *parse_image_header(bytes);
      const vlm::ImageSize s = vlm::smart_resize(info.height, info.width, cfg.effective_limits(),
                                                 cfg.geometry.factor());
      return process_image_to_size(rgb, s.height, s.width, cfg);
    }
    return process_image(rgb, cfg);
  } catch (const vlm::Error& e) {
    throw vlm::Error(vlm::str("image '", path, "' (", rgb.rows, "x", rgb.cols,
                              " h x w, after EXIF orientation): ", e.what()));
  }
}

}  // namespace vlm::data
