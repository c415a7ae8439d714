// Context parallelism: the `cp` ranks of a context-parallel group (ParallelDims::cp_comm(), cp
// consecutive ranks) run the same micro-batches, each rank the decoder on its share of the
// sequence (the model's side: vlm/model/sequence_parallel.h), in one of two modes
// (ShardingOptions::cp_mode, from dist.cp_mode):
//   - ulysses: rank r holds the contiguous chunk r of L / cp tokens; around every attention one
//     all-to-all gives each rank H / cp heads of the whole sequence and a second one returns
//     the result. The heads must divide by cp (the key/value heads divide cp or by it);
//   - ring: rank r holds chunks r and 2 cp - 1 - r of 2 cp; its queries stay, the key/value
//     blocks go around the ring, cp - 1 hops per attention (vlm/model/ring_attention.h). Any
//     head counts.
//
//   apply_context_parallel(*model, dims, mode);  // checks the model, installs the exchange
//
// Gradients: each rank's backward gives its tokens' share of every parameter's gradient;
// the data-parallel engines (DDP, FSDP over the world) sum over all ranks, cp ranks
// included, and the trainer divides by the step's supervised tokens counted once per group,
// so the update equals one process's on the whole batch. The vision tower splits its patches
// over the group too when its heads divide by cp (vlm/model/vision_split.h); otherwise it runs
// whole on every rank (its features of other ranks' tokens get no gradient there).
//
// Bytes per layer and micro-batch on a rank (Comm counters, all_to_all: what it sends to
// the other cp - 1 ranks), elements of b bytes, L the padded length:
//   attention, ulysses, Hk = max(Hkv, cp):
//     forward  (cp-1)/cp x B x L/cp x D x b x ((H + 2 Hk) [q, k, v] + H [output])
//   attention, ring (each hop is an all-to-all whose only non-empty split goes to the next
//   rank), kv = B x Hkv x L/cp x D x 2 [k and v]:
//     forward  (cp-1) x kv x b
//     backward (cp-1) x kv x b [the blocks again] + cp x kv x 4 [their fp32 gradients, the
//              last hop home]
//   Gated DeltaNet (either mode: split by heads), Hk = max(key heads, cp), Hv value heads:
//     forward  (cp-1)/cp x B x L/cp x b x ((2 Hk Dk + Hv Dv + 2 Hv) [q, k, v, b, a] + Hv Dv [output])
//   Ulysses backward: the same again (the reverse exchanges of the gradients).
// A layer under activation checkpointing runs its forward's exchanges again.
// ulysses_layer_bytes() and ring_layer_bytes() are those formulas.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "sharding/dist/comm.h"
#include "sharding/dist/parallel_dims.h"
#include "vlm/model/sequence_parallel.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::sharding {

// The exchange over `comm` (its ranks are the group; Comm::all_to_all as an autograd op, the
// ring pass an all-to-all with one non-empty split), in `mode`.
std::shared_ptr<vlm::SequenceExchange> comm_sequence_exchange(Comm& comm,
                                                              vlm::SequenceMode mode = vlm::SequenceMode::kUlysses);

// Checks that every decoder layer of `model` can split over dims.cp() ranks in `mode`
// (Ulysses: softmax attention whose heads divide by cp, key/value heads dividing or divided
// by cp; ring: any attention; Gated DeltaNet in either mode: value heads dividing by cp, key
// heads dividing or divided by cp) and installs the exchange over dims.cp_comm(). cp 1:
// nothing.
void apply_context_parallel(vlm::VisionLanguageModelImpl& model, ParallelDims& dims,
                            vlm::SequenceMode mode = vlm::SequenceMode::kUlysses);

// What the check of apply_context_parallel finds wrong with splitting `cfg`'s decoder over
// cp ranks in `mode` ("" when nothing). For `plan` and recipe validation.
std::string context_parallel_problem(const vlm::TextConfig& cfg, int64_t cp,
                                     vlm::SequenceMode mode = vlm::SequenceMode::kUlysses);

// The formula of the header comment: bytes one rank sends in one layer's forward and
// backward by Ulysses (its mixer `kind`) for a micro-batch of `batch` rows of `padded`
// tokens (a multiple of cp).
double ulysses_layer_bytes(const vlm::TextConfig& cfg, vlm::MixerKind kind, int64_t cp, int64_t batch,
                           int64_t padded, int64_t bytes_per_element);
// The same for an attention layer in ring mode (`padded` a multiple of 2 cp), its forward
// counted twice when the layer is `recomputed` (activation checkpointing).
double ring_layer_bytes(const vlm::TextConfig& cfg, int64_t cp, int64_t batch, int64_t padded,
                        int64_t bytes_per_element, bool recomputed = false);
// The vision tower's split (vlm/model/vision_split.h, either mode) for a micro-batch of
// `patches` patches (a text-only one: the dummy image's merge^2), Sp padded to a multiple of
// cp x merge^2, U = merge^2, H the tower's heads of D dims, O the merger's output:
//   every block: forward (cp-1)/cp x Sp/cp x D x b x (3 H [q, k, v] + H [output]), backward
//   the same again;
//   every merger (and DeepStack merger): forward (cp-1) x Sp/(cp U) x O x b [its rows to each
//   other rank], backward the same again.
// The tower's units recomputed (activation checkpointing): `recomputed` adds the blocks'
// forward again. 0 when the tower's heads do not divide by cp (it is not split).
double vision_split_bytes(const vlm::VisionConfig& v, int64_t cp, int64_t patches, int64_t bytes_per_element,
                          bool recomputed = false);

}  // namespace vlm::sharding
