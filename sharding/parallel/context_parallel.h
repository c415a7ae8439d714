// Context parallelism, Ulysses mode: the `cp` ranks of a context-parallel group
// (ParallelDims::cp_comm(), cp consecutive ranks) run the same micro-batches, each rank the
// decoder on its contiguous chunk of L / cp tokens; around every attention one all-to-all
// gives each rank H / cp heads of the whole sequence and a second one returns the result
// (the model's side: vlm/model/sequence_parallel.h).
//
//   apply_context_parallel(*model, dims);  // checks the model, installs the exchange
//
// Gradients: each rank's backward gives its chunk's share of every parameter's gradient;
// the data-parallel engines (DDP, FSDP over the world) sum over all ranks, cp ranks
// included, and the trainer divides by the step's supervised tokens counted once per group,
// so the update equals one process's on the whole batch. The vision tower runs on every
// rank of the group (its features of other chunks get no gradient there).
//
// Bytes per layer and micro-batch on a rank (Comm counters, all_to_all: what it sends to
// the other cp - 1 ranks), elements of b bytes:
//   attention, Hk = max(Hkv, cp):
//     forward  (cp-1)/cp x B x L/cp x D x b x ((H + 2 Hk) [q, k, v] + H [output])
//   Gated DeltaNet, Hk = max(key heads, cp), Hv value heads:
//     forward  (cp-1)/cp x B x L/cp x b x ((2 Hk Dk + Hv Dv + 2 Hv) [q, k, v, b, a] + Hv Dv [output])
//   backward the same again (the reverse exchanges of the gradients).
// ulysses_layer_bytes() is that formula.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "sharding/dist/comm.h"
#include "sharding/dist/parallel_dims.h"
#include "vlm/model/sequence_parallel.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::sharding {

// The exchange over `comm` (its ranks are the group; Comm::all_to_all as an autograd op).
std::shared_ptr<vlm::SequenceExchange> comm_sequence_exchange(Comm& comm);

// Checks that every decoder layer of `model` can split over dims.cp() ranks (softmax
// attention whose heads divide by cp, key/value heads dividing or divided by cp; Gated
// DeltaNet: value heads dividing by cp, key heads dividing or divided by cp) and installs
// the exchange over dims.cp_comm(). cp 1: nothing.
void apply_context_parallel(vlm::VisionLanguageModelImpl& model, ParallelDims& dims);

// What the check of apply_context_parallel finds wrong with splitting `cfg`'s decoder over
// cp ranks ("" when nothing). For `plan` and recipe validation.
std::string context_parallel_problem(const vlm::TextConfig& cfg, int64_t cp);

// The formula of the header comment: bytes one rank sends in one layer's forward and
// backward (its mixer `kind`) for a micro-batch of `batch` rows of `padded` tokens (a
// multiple of cp).
double ulysses_layer_bytes(const vlm::TextConfig& cfg, vlm::MixerKind kind, int64_t cp, int64_t batch,
                           int64_t padded, int64_t bytes_per_element);

}  // namespace vlm::sharding
