// The vision tower's patches split over a context-parallel group (Ulysses, as the decoder's
// sequence in sequence_parallel.h): every rank of the group encodes the same micro-batch's
// images, each its own contiguous run of the packed patches, so the tower's activations fall
// as 1 / cp like the decoder's.
//
//   - The patches (after Qwen2.5's window permutation, a permutation of whole merge groups
//     computed on the host for the whole micro-batch) are padded to a multiple of
//     cp x merge^2 and cut in cp runs: merge groups stay whole on one rank, so the mergers
//     run on the rank's rows. Padding patches are zero rows in a segment of their own.
//   - Every block's attention turns its run's q / k / v into every patch's q / k / v for
//     H / cp heads with one all-to-all (seq_to_heads), attends over the whole sequence with
//     the segments (images, or Qwen2.5's windows; padding its own), and turns back
//     (heads_to_seq): vision_attention_split below.
//   - The merger's (and DeepStack mergers') outputs are gathered over the group (gather:
//     an all-to-all of the rank's rows to every rank; backward: each rank's rows get the
//     sum of the group's gradients), padding dropped, so every rank places every image
//     feature in the whole micro-batch's embeddings.
// Sizes come from grid_thw on the host: no host sync. Every rank of the group issues the same
// exchanges (text-only micro-batches run the one dummy image on every rank). A tower whose
// heads do not divide by cp is not split (every rank encodes the images whole, exact as well:
// each rank's features of other ranks' tokens get no gradient there).
//
// Names: S patches, Sp padded to a multiple of cp x U (U = merge^2), Sr = Sp / cp this rank's.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "vlm/model/sequence_parallel.h"

namespace vlm {

struct VisionSplit {
  SequenceExchange* sp = nullptr;  // null: no split (every method is then the identity)
  int64_t patches = 0;             // S
  int64_t padded = 0;              // Sp
  int64_t begin = 0, len = 0;      // this rank's rows [begin, begin + len) of the padded sequence
  bool active() const { return sp != nullptr; }
  // x: [S, ...] (the whole micro-batch's rows, or with `index` [S] int64 on the host: row
  // index[i] of x as row i) -> this rank's [Sr, ...], zero rows past S: a tensor of its own
  // (not a view of x) when active.
  torch::Tensor rows(const torch::Tensor& x, const torch::Tensor& index = torch::Tensor()) const;
  // The whole padded sequence's attention segments: cu (0 .. S), then [S, Sp) when padded.
  std::vector<int64_t> segments(const std::vector<int64_t>& cu) const;
  // merged: this rank's [Sr / U, O] -> the group's in sequence order, padding dropped:
  // [S / U, O]. Differentiable (every rank of the group must call it, in the same order).
  torch::Tensor gather(const torch::Tensor& merged, const std::string& what) const;
};

// The split of `patches` patches (merge groups of `unit` rows) of a tower of `heads`
// attention heads over sp's group. Inactive (the tower runs whole on every rank of the group,
// as without sp) when sp is null or of size 1, or when the heads do not divide by cp.
VisionSplit vision_split(SequenceExchange* sp, int64_t patches, int64_t unit, int64_t heads);
// Whether a tower of `heads` heads splits over cp ranks (vision_split's rule).
inline bool vision_splits(int64_t heads, int64_t cp) { return cp > 1 && heads % cp == 0; }

// Ulysses around one vision attention: q / k / v [Sr, H, D] (this rank's rows, after the
// rotary) -> the attention output of the same rows [Sr, H, D], attending over every patch of
// the padded sequence within `segments` (VisionSplit::segments). H must divide by cp.
torch::Tensor vision_attention_split(SequenceExchange& sp, const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const std::vector<int64_t>& segments, double scale);

}  // namespace vlm
