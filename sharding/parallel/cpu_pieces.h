// CPU work in pieces: tensors cut into pieces of at most kPiece elements, run on ATen's
// intra-op threads (the optimizer's blocked AdamW and its grad-norm sum, optimizer.h).
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace vlm::sharding {

// Pieces of at most kPiece elements (a multiple of 64, so the vectorised loops of each ATen
// op see the same element runs as on the whole tensor) for the CPU paths: 1 MiB of
// fp32 per tensor, so an update's five tensors stay in cache (L2 / L3) between its ops while
// the ~10 op calls per piece cost little (64K-element pieces: 5% slower on the optimizer bench).
constexpr int64_t kPiece = 256 * 1024;

struct Piece {
  size_t tensor;  // index into the caller's list
  int64_t offset, len;
};
// The pieces of 1-d tensors of sizes `lens`, and the first element of each in one running
// count (start: ascending; the total is returned in *total).
std::vector<Piece> cut_pieces(const std::vector<int64_t>& lens, std::vector<int64_t>* start, int64_t* total);

// Runs fn(lo, hi) on ATen's intra-op threads, each call with a contiguous share of [0, n)
// (not at::parallel_for, which vlmtrain's files, built without OpenMP, run on one thread).
void parallel_ranges(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

// Runs fn(piece index, scratch) for every piece, in parallel over the elements (threads get
// equal element counts however the tensors are sized): a piece belongs to the thread whose
// range holds its first element. ATen ops inside fn run on the calling thread. `scratch` is
// the call's buffer (undefined at first, for fn to allocate once per call, not per piece).
void for_each_piece(const std::vector<int64_t>& start, int64_t total,
                    const std::function<void(size_t, torch::Tensor&)>& fn);

// sum of squares of every element of `parts` (any devices / float dtypes), in fp64: on CPU
// pieces in parallel, summed in a fixed order; on a device one _foreach_norm (fp32 accumulation) and one host
// transfer per device (one in practice).
double sum_of_squares(const std::vector<torch::Tensor>& parts);

}  // namespace vlm::sharding
