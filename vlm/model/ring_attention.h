// Ring attention: causal attention over a sequence whose tokens are split over the `cp` ranks
// of a context-parallel group (SequenceMode::kRing, sequence_parallel.h), without any rank
// holding every query. The queries stay where they are; the key/value blocks travel around
// the ring:
//   step s = 0 .. cp-1: this rank holds the keys and values of rank (rank - s) mod cp (its own
//   at step 0, then one SequenceExchange::ring_pass per step: cp - 1 hops per attention, the
//   last block needs none), attends its queries to them with the mask built from global token
//   positions, and merges the block into a running result flash-style:
//     lse = logaddexp(lse, lse_b); out = out * exp(lse_old - lse) + out_b * exp(lse_b - lse)
// Backward (one autograd node for the whole ring, as flash attention's): the blocks go around
// the ring again, each with its gradient accumulator: at step s this rank adds the gradient of
// its queries' pairs with the held block to that block's dk / dv (fp32) and passes both on; after
// the last step one more hop brings each block's dk / dv home. The probabilities are recomputed
// per block from the saved output's lse, so the node keeps only this rank's q, k, v, the output
// and its lse: no received block, no score matrix survives the forward.
//
// Masking (positions are global, so it is the unsplit attention's mask): query p may attend key
// p' when p' <= p (causal), key p' is real (key_mask), and p and p' lie in the same packed
// segment (cu_seqlens); a query always attends itself (as causal_padding_mask: no empty row,
// padding rows are ignored by the loss). Each block is computed in fp32 with explicit scores
// and a per-row logsumexp; a row that sees no key of a block contributes 0 with lse -inf, no
// NaN. Work is split per pair of held runs (a query run of this rank, a key run of the block's
// owner: ring layout, two of each); a pair whose keys all lie after its queries (known on the
// host from positions) is skipped, so the load-balanced split computes about half of each
// off-diagonal block. Every block takes part in the ring whether used or not, so every rank
// runs the same hops, forward and backward.
//
// Memory per rank and layer: saved, q, k, v and the output of the rank's Lr tokens (the
// activation dtype) and the lse (fp32 [B, H, Lr]); transient, a few fp32 score tiles of at most
// tile_bytes each (256 MiB: a block pair runs tile by tile of query rows) and the held block
// (and in backward its fp32 gradient). No overlap
// of a hop with the block's compute yet (the Comm ops are synchronous). Traffic per layer and
// micro-batch on a rank, kv = B x Hkv x Lr x D x 2 (k and v): forward (cp - 1) hops of kv in the
// activation dtype; backward (cp - 1) hops of kv again and cp hops of its gradient in fp32.
//
// Names: B batch, H query heads, Hkv key/value heads (GQA: query head j uses kv head
// j / (H / Hkv)), Lr this rank's tokens (L / cp), L the padded sequence, D head_dim.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "vlm/model/sequence_parallel.h"

namespace vlm {

// q: [B, H, Lr, D], k / v: [B, Hkv, Lr, D]: this rank's tokens (sequence_layout of ex.mode()
// for L = cp x Lr; ring mode in the model, but any layout works), after the rotary, in the
// activation dtype. key_mask: bool [B, L] (true = real key) over the whole padded sequence, or
// undefined (every key real). cu_seqlens: the packed row's segments over the whole padded
// sequence (0 .. L; B == 1), or null (one segment). Every rank of the group must call it with
// the same shapes, in the same order (cp - 1 ring passes forward, 2 cp - 1 backward).
// tile_bytes: the most fp32 score bytes one tile of query rows of a block pair may take
// (a pair runs tile by tile). -> [B, H, Lr, D] in q's dtype.
constexpr int64_t kRingTileBytes = int64_t{256} << 20;
torch::Tensor ring_attention(SequenceExchange& ex, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& key_mask,
                             const std::vector<int64_t>* cu_seqlens, double scale, const std::string& what,
                             int64_t tile_bytes = kRingTileBytes);

}  // namespace vlm
