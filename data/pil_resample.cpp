#include "data/pil_resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "vlm/runtime/check.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define VLM_RESAMPLE_AVX2 1
#include <immintrin.h>
#endif

namespace vlm::data {
namespace {

// ---- Pillow's Resample.c (ImagingResample, 8 bits per channel), transcribed.
constexpr int kPrecisionBits = 32 - 8 - 2;  // fixed-point weights: 22 fractional bits
constexpr int32_t kHalf = 1 << (kPrecisionBits - 1);

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

// Horizontal pass: [h, w_in, 3] -> [h, w_out, 3].
void horizontal_reference(const cv::Mat& in, cv::Mat& out, const PilCoeffs& c) {
  for (int y = 0; y < in.rows; ++y) {
    const uint8_t* src = in.ptr<uint8_t>(y);
    uint8_t* dst = out.ptr<uint8_t>(y);
    for (int o = 0; o < out.cols; ++o, dst += 3) {
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
}

// Vertical pass of output rows [o0, o1) over bytes [i0, n) of each row:
// [h_in, w, 3] -> [h_out, w, 3].
void vertical_reference(const cv::Mat& in, cv::Mat& out, const PilCoeffs& c, int i0 = 0) {
  const int n = in.cols * 3;
  std::vector<int32_t> acc(static_cast<size_t>(n));
  for (int o = 0; o < out.rows; ++o) {
    std::fill(acc.begin() + i0, acc.end(), kHalf);
    const int32_t* k = &c.kk[size_t(o) * c.ksize];
    for (int j = 0; j < c.bounds[2 * o + 1]; ++j) {
      const uint8_t* s = in.ptr<uint8_t>(c.bounds[2 * o] + j);
      const int32_t w = k[j];
      for (int i = i0; i < n; ++i) acc[i] += s[i] * w;
    }
    uint8_t* dst = out.ptr<uint8_t>(o);
    for (int i = i0; i < n; ++i) dst[i] = pil_clip8(acc[i]);
  }
}

#ifdef VLM_RESAMPLE_AVX2
#define VLM_AVX2 __attribute__((target("avx2")))

// acc += u8[0..8) * w for the low 8 bytes of v.
VLM_AVX2 inline __m256i mac8(__m256i acc, __m128i v, __m256i w) {
  return _mm256_add_epi32(acc, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(v), w));
}

// 32 fixed-point sums -> 32 bytes in order, each (sum >> 22) clipped to [0, 255].
VLM_AVX2 inline __m256i pack32(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
  const __m256i p01 = _mm256_packs_epi32(_mm256_srai_epi32(a0, kPrecisionBits),
                                         _mm256_srai_epi32(a1, kPrecisionBits));
  const __m256i p23 = _mm256_packs_epi32(_mm256_srai_epi32(a2, kPrecisionBits),
                                         _mm256_srai_epi32(a3, kPrecisionBits));
  // Packs work per 128-bit lane: undo the interleave of 4-byte groups.
  return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p01, p23),
                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

VLM_AVX2 void vertical_avx2(const cv::Mat& in, cv::Mat& out, const PilCoeffs& c) {
  const int n = in.cols * 3, n32 = n / 32 * 32;
  std::vector<const uint8_t*> rows(static_cast<size_t>(c.ksize));
  for (int o = 0; o < out.rows; ++o) {
    const int32_t* k = &c.kk[size_t(o) * c.ksize];
    const int taps = c.bounds[2 * o + 1];
    for (int j = 0; j < taps; ++j) rows[j] = in.ptr<uint8_t>(c.bounds[2 * o] + j);
    uint8_t* dst = out.ptr<uint8_t>(o);
    for (int i = 0; i < n32; i += 32) {
      __m256i a0 = _mm256_set1_epi32(kHalf), a1 = a0, a2 = a0, a3 = a0;
      for (int j = 0; j < taps; ++j) {
        const __m256i w = _mm256_set1_epi32(k[j]);
        const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + i));
        const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + i + 16));
        a0 = mac8(a0, lo, w);
        a1 = mac8(a1, _mm_srli_si128(lo, 8), w);
        a2 = mac8(a2, hi, w);
        a3 = mac8(a3, _mm_srli_si128(hi, 8), w);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), pack32(a0, a1, a2, a3));
    }
  }
  if (n32 < n) vertical_reference(in, out, c, n32);  // the last < 32 bytes of each row
}

constexpr int kTileRows = 16;                // rows per horizontal tile
constexpr int kTileBytes = kTileRows * 3;    // bytes per column of a tile: 48

// Rows [y0, y0 + rows) of `in` into tile[x * 48 + r * 3 + ch] (ch RGB). 4-byte copies,
// x outer so that the byte each copy spills over is rewritten by the next row (or, for
// r = 15, lands in column x + 1, written after); the last column copies 3 bytes.
void load_tile(const cv::Mat& in, int y0, int rows, uint8_t* tile) {
  const int w = in.cols;
  const uint8_t* src[kTileRows];
  for (int r = 0; r < rows; ++r) src[r] = in.ptr<uint8_t>(y0 + r);
  for (int x = 0; x + 1 < w; ++x) {
    uint8_t* col = tile + size_t(x) * kTileBytes;
    for (int r = 0; r < rows; ++r) std::memcpy(col + 3 * r, src[r] + 3 * x, 4);
  }
  uint8_t* last = tile + size_t(w - 1) * kTileBytes;
  for (int r = 0; r < rows; ++r) std::memcpy(last + 3 * r, src[r] + 3 * (w - 1), 3);
}

VLM_AVX2 void horizontal_avx2(const cv::Mat& in, cv::Mat& out, const PilCoeffs& c) {
  // +16: the 4-byte copies of the last column, and 16-byte loads of the last column.
  std::vector<uint8_t> tile(size_t(in.cols) * kTileBytes + 16, 0);
  alignas(32) uint8_t sums[64];
  for (int y0 = 0; y0 < in.rows; y0 += kTileRows) {
    const int rows = std::min(kTileRows, in.rows - y0);
    load_tile(in, y0, rows, tile.data());
    uint8_t* dst[kTileRows];
    for (int r = 0; r < rows; ++r) dst[r] = out.ptr<uint8_t>(y0 + r);
    for (int o = 0; o < out.cols; ++o) {
      const int32_t* k = &c.kk[size_t(o) * c.ksize];
      const uint8_t* col = tile.data() + size_t(c.bounds[2 * o]) * kTileBytes;
      __m256i a0 = _mm256_set1_epi32(kHalf), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
      for (int j = 0, taps = c.bounds[2 * o + 1]; j < taps; ++j, col += kTileBytes) {
        const __m256i w = _mm256_set1_epi32(k[j]);
        const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(col));
        const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(col + 16));
        const __m128i v2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(col + 32));
        a0 = mac8(a0, v0, w);
        a1 = mac8(a1, _mm_srli_si128(v0, 8), w);
        a2 = mac8(a2, v1, w);
        a3 = mac8(a3, _mm_srli_si128(v1, 8), w);
        a4 = mac8(a4, v2, w);
        a5 = mac8(a5, _mm_srli_si128(v2, 8), w);
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(sums), pack32(a0, a1, a2, a3));
      _mm256_store_si256(reinterpret_cast<__m256i*>(sums + 32), pack32(a4, a5, a4, a5));
      for (int r = 0; r < rows; ++r) std::memcpy(dst[r] + 3 * o, sums + 3 * r, 3);
    }
  }
}
#endif  // VLM_RESAMPLE_AVX2

using Pass = void (*)(const cv::Mat&, cv::Mat&, const PilCoeffs&);

cv::Mat resize_with(const cv::Mat& rgb, int64_t height, int64_t width, Pass horizontal,
                    Pass vertical) {
  VLM_CHECK(rgb.type() == CV_8UC3, "resize_bicubic_aa: expected an 8-bit RGB image (CV_8UC3), ",
            "got type ", rgb.type());
  VLM_CHECK(height > 0 && width > 0, "resize_bicubic_aa: target ", height, "x", width,
            " is empty");
  // As Image.resize: an axis whose size does not change is not resampled; horizontal first.
  cv::Mat x = rgb;
  if (width != x.cols) {
    cv::Mat h(x.rows, static_cast<int>(width), CV_8UC3);
    horizontal(x, h, pil_coeffs(x.cols, static_cast<int>(width)));
    x = h;
  }
  if (height != x.rows) {
    cv::Mat v(static_cast<int>(height), x.cols, CV_8UC3);
    vertical(x, v, pil_coeffs(x.rows, static_cast<int>(height)));
    x = v;
  }
  return x.data == rgb.data ? rgb.clone() : x;
}

void vertical_reference_all(const cv::Mat& in, cv::Mat& out, const PilCoeffs& c) {
  vertical_reference(in, out, c);
}

}  // namespace

bool resize_uses_avx2() {
#ifdef VLM_RESAMPLE_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

cv::Mat resize_bicubic_aa_reference(const cv::Mat& rgb, int64_t height, int64_t width) {
  return resize_with(rgb, height, width, horizontal_reference, vertical_reference_all);
}

cv::Mat resize_bicubic_aa(const cv::Mat& rgb, int64_t height, int64_t width) {
#ifdef VLM_RESAMPLE_AVX2
  if (resize_uses_avx2()) return resize_with(rgb, height, width, horizontal_avx2, vertical_avx2);
#endif
  return resize_bicubic_aa_reference(rgb, height, width);
}

}  // namespace vlm::data
