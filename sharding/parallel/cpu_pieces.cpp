// CPU work in pieces (see cpu_pieces.h).
#include "sharding/parallel/cpu_pieces.h"

#include <ATen/TensorIterator.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <utility>

#include "vlm/runtime/check.h"

namespace vlm::sharding {

// The pieces of 1-d tensors of sizes `lens`, and the first element of each in one running
// count (start: ascending; the total is returned in *total).
std::vector<Piece> cut_pieces(const std::vector<int64_t>& lens, std::vector<int64_t>* start, int64_t* total) {
  std::vector<Piece> pieces;
  int64_t n = 0;
  for (size_t i = 0; i < lens.size(); ++i)
    for (int64_t off = 0; off < lens[i]; off += kPiece) {
      pieces.push_back({i, off, std::min(kPiece, lens[i] - off)});
      start->push_back(n);
      n += pieces.back().len;
    }
  *total = n;
  return pieces;
}

// Runs fn(lo, hi) on ATen's intra-op threads, each call with a contiguous share of [0, n)
// (multiples of kUnit elements). Not at::parallel_for: under OpenMP that is an inline
// `#pragma omp parallel`, and this file is built without OpenMP, so it would run on the
// calling thread. A TensorIterator's for_each runs inside libtorch, in parallel: it walks an
// int64 tensor of unit indices [ceil(n / kUnit)] and hands each thread a range of them.
constexpr int64_t kUnit = 16 * 1024;
void parallel_ranges(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  torch::Tensor units = torch::arange((n + kUnit - 1) / kUnit, torch::kInt64);
  at::TensorIterator iter =
      at::TensorIteratorConfig().add_output(units).resize_outputs(false).check_all_same_dtype(false).build();
  iter.for_each(
      [&](char** data, const int64_t* strides, int64_t size) {
        VLM_ASSERT(strides[0] == static_cast<int64_t>(sizeof(int64_t)), "unit indices must be contiguous");
        const int64_t first = *reinterpret_cast<const int64_t*>(data[0]);
        fn(first * kUnit, std::min(n, (first + size) * kUnit));
      },
      /*grain_size=*/1);
}

// Runs fn(piece index, scratch) for every piece, in parallel over the elements (threads get
// equal element counts however the tensors are sized): a piece belongs to the thread whose
// range holds its first element. ATen ops inside fn run on the calling thread. `scratch` is
// the call's buffer (undefined at first, for fn to allocate once per call, not per piece).
void for_each_piece(const std::vector<int64_t>& start, int64_t total,
                    const std::function<void(size_t, torch::Tensor&)>& fn) {
  parallel_ranges(total, [&](int64_t lo, int64_t hi) {
    torch::Tensor scratch;
    for (size_t p = std::lower_bound(start.begin(), start.end(), lo) - start.begin(); p < start.size() && start[p] < hi;
         ++p)
      fn(p, scratch);
  });
}

// sum of squares of every element of CPU tensors `parts` in fp64, piece by piece in
// parallel (a whole-tensor fp64 norm first converts the tensor to fp64 in memory, then
// reduces it on one thread); the pieces summed in order, so the result does not depend on the
// thread count. fp32 pieces go through fp32_sum_of_squares (one pass, no fp64 copy; 40M
// elements on one thread: 8 ms against 22 for copy + ATen norm); other dtypes are copied to fp64 (exact) and ATen's norm squared.
namespace {

// sum over x[0..n) of double(x[i])^2, in 16 fixed lanes (lane i % 16), summed in a fixed tree:
// the same bits whichever instruction set runs it.
double fp32_sum_of_squares_scalar(const float* x, int64_t n) {
  double acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += double(x[i + k]) * double(x[i + k]);
  for (int k = 0; i < n; ++i, ++k) acc[k] += double(x[i]) * double(x[i]);
  for (int w = 8; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

#if defined(__x86_64__)
// The same lanes in four AVX registers of four doubles (lanes 0-3, 4-7, 8-11, 12-15); a
// multiply then an add (no FMA), as the scalar loop rounds.
__attribute__((target("avx2"))) double fp32_sum_of_squares_avx2(const float* x, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256d v0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), v1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    const __m256d v2 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)), v3 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
    a0 = _mm256_add_pd(a0, _mm256_mul_pd(v0, v0));
    a1 = _mm256_add_pd(a1, _mm256_mul_pd(v1, v1));
    a2 = _mm256_add_pd(a2, _mm256_mul_pd(v2, v2));
    a3 = _mm256_add_pd(a3, _mm256_mul_pd(v3, v3));
  }
  double acc[16];
  _mm256_storeu_pd(acc, a0);
  _mm256_storeu_pd(acc + 4, a1);
  _mm256_storeu_pd(acc + 8, a2);
  _mm256_storeu_pd(acc + 12, a3);
  for (int k = 0; i < n; ++i, ++k) acc[k] += double(x[i]) * double(x[i]);
  for (int w = 8; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}
#endif

double fp32_sum_of_squares(const float* x, int64_t n) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return fp32_sum_of_squares_avx2(x, n);
#endif
  return fp32_sum_of_squares_scalar(x, n);
}

double cpu_sum_of_squares(const std::vector<torch::Tensor>& parts) {
  std::vector<torch::Tensor> flat;
  std::vector<int64_t> lens, start;
  for (const auto& t : parts) {
    flat.push_back(t.reshape({-1}).contiguous());
    lens.push_back(t.numel());
  }
  int64_t total = 0;
  const std::vector<Piece> pieces = cut_pieces(lens, &start, &total);
  std::vector<double> sq(pieces.size(), 0.0);
  for_each_piece(start, total, [&](size_t p, torch::Tensor& scratch) {
    const Piece& pc = pieces[p];
    const torch::Tensor& t = flat[pc.tensor];
    if (t.scalar_type() == torch::kFloat32) {
      sq[p] = fp32_sum_of_squares(t.data_ptr<float>() + pc.offset, pc.len);
      return;
    }
    if (!scratch.defined()) scratch = torch::empty({kPiece}, torch::kFloat64);
    torch::Tensor x = scratch.narrow(0, 0, pc.len);
    x.copy_(t.narrow(0, pc.offset, pc.len));  // exact: bf16 / fp16 / fp64 -> fp64
    const double n = at::linalg_vector_norm(x, 2).item<double>();
    sq[p] = n * n;
  });
  double sumsq = 0;
  for (double x : sq) sumsq += x;
  return sumsq;
}

}  // namespace

// sum of squares of every element of `parts` (any devices / float dtypes), in fp64: on CPU
// cpu_sum_of_squares; on a device one _foreach_norm (fp32 accumulation) and one host
// transfer per device (one in practice).
double sum_of_squares(const std::vector<torch::Tensor>& parts) {
  std::vector<std::pair<c10::Device, std::vector<torch::Tensor>>> by_device;
  for (const auto& t : parts) {
    auto it = std::find_if(by_device.begin(), by_device.end(), [&](const auto& e) { return e.first == t.device(); });
    if (it == by_device.end()) {
      by_device.emplace_back(t.device(), std::vector<torch::Tensor>{});
      it = by_device.end() - 1;
    }
    it->second.push_back(t);
  }
  double sumsq = 0;
  for (const auto& [device, list] : by_device) {
    if (device.is_cpu()) {
      sumsq += cpu_sum_of_squares(list);
      continue;
    }
    const std::vector<torch::Tensor> norms = at::_foreach_norm(list, 2, torch::kFloat32);  // [] each
    sumsq += torch::stack(norms).to(torch::kFloat64).square().sum().item<double>();  // the host transfer
  }
  return sumsq;
}

}  // namespace vlm::sharding
