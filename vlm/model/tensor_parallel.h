// Tensor parallelism inside the model (Megatron-LM's column / row split with sequence
// parallelism): the `tp` ranks of a tensor-parallel group each hold a slice of every decoder
// layer's heads and MLP width, and of the vocabulary.
//
// Which parameters split (tensor_parallel_split; every split is even, blocks along one dim):
//   self_attn.q_proj / k_proj / v_proj (weight, bias): rows, by heads (q_proj's rows of
//     Qwen3.5's gated attention are [query, gate] per head: still by heads);
//   self_attn.o_proj: columns, by heads;
//   mlp.gate_proj / up_proj (dense layers): rows; mlp.down_proj: columns;
//   linear_attn (Gated DeltaNet): in_proj_qkv and conv1d rows in three blocks [q, k, v] by
//     key / value heads, in_proj_z / in_proj_b / in_proj_a / A_log / dt_bias by value heads,
//     out_proj columns; its norm (over one head's Dv) is replicated;
//   model.embed_tokens and lm_head: rows, by vocabulary (the head's logits and the
//     cross-entropy are vocabulary-parallel: no rank holds [tokens, V] logits).
// Everything else is replicated on the group's ranks: the vision tower and merger, the
// norms (q_norm / k_norm too), the routers and experts of sparse layers (experts split by
// expert parallelism or FSDP, not by tp), the final norm.
//
// The training forward (VisionLanguageModelImpl::forward with labels, no logits) runs the
// decoder in Megatron's sequence-parallel layout: between layers every rank holds chunk r of
// L / tp tokens (sequence_chunk, padded to a multiple of tp like context parallelism), and
// each layer is
//   h = x + reduce_scatter(mixer(all_gather(input_layernorm(x))))      // mixer on its heads
//   out = h + reduce_scatter(mlp(all_gather(post_attention_layernorm(h))))  // its MLP width
// (a sparse layer's experts run on the rank's chunk, like the norms). Outside the decoder the
// ranks compute the same things (vision tower, embeddings, positions), and the final hidden
// states are gathered for the vocabulary-parallel loss.
// Gradients: a replicated parameter's gradient on one rank is its share (the rank's chunk of
// the tokens, or its heads for q_norm / k_norm); the group's ranks sum them
// (sharding/parallel/tensor_parallel.h does, once per step). So do the tp / Hkv ranks that
// hold one kv head's k_proj / v_proj piece (each for its own query heads). A split
// parameter's gradient is whole on its rank. loss_sum on each rank is 1 / tp of the micro-batch's loss (the ranks'
// values sum to it; each rank's backward is the whole loss's, through its vocabulary slice).
//
// Without labels (evaluation, generation: logits) the decoder runs whole on every rank:
// mixer and MLP outputs are all-reduced, the logits gathered over the vocabulary.
//
// The collectives are the group exchange's (SequenceExchange::all_gather / reduce_scatter /
// all_reduce, installed by sharding/ with VisionLanguageModelImpl::set_tensor_exchange: native
// ops over the tp process group), differentiable: an all-gather's backward is a
// reduce-scatter and the reverse. Bytes: tensor_parallel_layer_bytes in
// sharding/parallel/tensor_parallel.h.
//
// Names: B batch, L the padded sequence (a multiple of tp), Lt = L / tp, d hidden, V vocab.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "vlm/model/config.h"
#include "vlm/model/sequence_parallel.h"

namespace vlm {

// x: [..., n, ...] (dim `dim` of size n, the same on every rank) -> [..., tp * n, ...]: the
// ranks' tensors concatenated along dim in rank order. Backward: the sum over the ranks of
// the gradient's chunk r (a reduce-scatter).
torch::Tensor tp_all_gather(SequenceExchange& ex, const torch::Tensor& x, int64_t dim, const std::string& what);
// x: [..., tp * n, ...] -> [..., n, ...]: chunk r of the sum over the ranks. Backward: an
// all-gather of the gradient.
torch::Tensor tp_reduce_scatter(SequenceExchange& ex, const torch::Tensor& x, int64_t dim, const std::string& what);
// x: any shape -> the sum over the ranks. Backward: the sum over the ranks of the gradient.
torch::Tensor tp_all_reduce(SequenceExchange& ex, const torch::Tensor& x, const std::string& what);

// How one parameter splits over a group of tp ranks: along `dim`, the dimension is the
// concatenation of `blocks` (their full sizes), each cut into `parts` equal pieces; rank r
// holds piece r x parts / tp of every block, concatenated. parts is tp, except for k_proj /
// v_proj when the key/value heads are fewer than tp: parts = Hkv, each kv head held by tp / Hkv
// consecutive ranks (the ones whose query heads use it). dim < 0: replicated.
struct TpSplit {
  int64_t dim = -1;
  std::vector<int64_t> blocks;
  int64_t parts = 1;
  bool split() const { return dim >= 0; }
  int64_t piece(int64_t rank, int64_t tp) const { return rank * parts / tp; }  // rank's piece
};
// The split over tp ranks of parameter `name` (HF name, e.g.
// "model.layers.3.self_attn.q_proj.weight") of a model of `cfg` (full sizes).
TpSplit tensor_parallel_split(const VlmConfig& cfg, const std::string& name, int64_t tp);
// full -> rank r's slice (a copy); and the slices of every rank (in rank order, all tp of
// them) -> full.
torch::Tensor tp_slice(const torch::Tensor& full, const TpSplit& split, int64_t rank, int64_t tp);
torch::Tensor tp_unslice(const std::vector<torch::Tensor>& slices, const TpSplit& split);

// What keeps `cfg` from splitting over tp ranks ("" when nothing): heads, MLP width, Gated
// DeltaNet key and value heads and the vocabulary must divide by tp; the key/value heads
// divide by tp or divide tp (fewer than tp: each is replicated on tp / Hkv ranks).
std::string tensor_parallel_problem(const TextConfig& cfg, int64_t tp);
// The decoder layers' view of one rank: heads, kv heads (at least 1), MLP width and Gated
// DeltaNet heads divided by tp (head_dim kept explicit). cfg.tensor_parallel says tp.
TextConfig tensor_parallel_local(const TextConfig& cfg);

// The vocabulary-parallel embedding: ids [...] -> [..., d], rows [offset, offset + Vt) of the
// vocabulary looked up in `weight` [Vt, d] (the others zero), summed over the group
// (tp_all_reduce). padding_idx: the full vocabulary's (-1: none).
torch::Tensor vocab_parallel_embedding(SequenceExchange& ex, const torch::Tensor& weight, const torch::Tensor& ids,
                                       int64_t padding_idx, const std::string& what);

// The vocabulary-parallel loss: sum over rows of logsumexp(logits_i) - logits_i[label_i]
// (fp32 scalar) of logits = hidden @ weight^T over the whole vocabulary, where this rank holds
// `weight` [Vt, d], rows [rank * Vt, (rank + 1) * Vt) of the head, and every rank the same
// hidden [N, d] and labels [N] (-100 ignored). Over row chunks as chunked_cross_entropy.h (at
// most a [rows, Vt] fp32 block of logits at a time, recomputed in backward); per chunk one
// exchange of the ranks' row maxima and one of the sums of exp and the label logits. Returns
// the loss on every rank; its gradient is hidden's share of this rank's vocabulary slice
// (summed over the group by the caller's all-gather backward) and weight's whole gradient.
torch::Tensor vocab_parallel_cross_entropy(SequenceExchange& ex, const torch::Tensor& hidden,
                                           const torch::Tensor& weight, const torch::Tensor& labels,
                                           int64_t chunk_rows = 0);

}  // namespace vlm
