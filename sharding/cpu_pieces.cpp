// CPU work in pieces (see cpu_pieces.h).
#include "sharding/cpu_pieces.h"

#include <ATen/TensorIterator.h>

#include <algorithm>
#include <utility>

#include "vlm/check.h"

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
// reduces it on one thread): each piece's fp64 norm (its conversion in cache), squared; the
// pieces summed in order, so the result does not depend on the thread count.
namespace {
double cpu_sum_of_squares(const std::vector<torch::Tensor>& parts) {
  std::vector<torch::Tensor> flat;
  std::vector<int64_t> lens, start;
  for (const auto& t : parts) {
    flat.push_back(t.reshape({-1}));
    lens.push_back(t.numel());
  }
  int64_t total = 0;
  const std::vector<Piece> pieces = cut_pieces(lens, &start, &total);
  std::vector<double> sq(pieces.size(), 0.0);
  for_each_piece(start, total, [&](size_t p, torch::Tensor& scratch) {
    const Piece& pc = pieces[p];
    if (!scratch.defined()) scratch = torch::empty({kPiece}, torch::kFloat64);
    torch::Tensor x = scratch.narrow(0, 0, pc.len);
    x.copy_(flat[pc.tensor].narrow(0, pc.offset, pc.len));  // exact: fp32 / bf16 / fp16 -> fp64
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
