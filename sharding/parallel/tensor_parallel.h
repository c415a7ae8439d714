// Tensor parallelism: the `tp` consecutive ranks of a tensor-parallel group
// (ParallelDims::tp_comm()) each hold a slice of every decoder layer's heads and MLP width and
// of the vocabulary, and run the same micro-batches, the decoder in Megatron's
// sequence-parallel layout (the model's side, the splits and the layout:
// vlm/model/tensor_parallel.h).
//
//   auto source = tensor_parallel_source(std::move(whole_source), cfg, whole_shapes,
//                                        dims.tp_rank(), dims.tp());   // the whole model's source
//   cfg.text.tensor_parallel = dims.tp();            // then build the model (meta) for one rank
//   apply_policies(model, opts, dims, source.get()); // installs the exchange (below)
// (app/config/model_source.h does the first two for the trainer.)
//
// Data parallelism composes as 2D (dp x tp): the lanes of ParallelDims span the world / tp
// ranks with the same tp_rank(), so DDP and FSDP shard and reduce each tp rank's slices over
// its data-parallel group. The optimizer then sums the shared parameters' gradients over the
// ranks that share them (one all-reduce per step of all of them; each rank's was its share:
// vlm/model/tensor_parallel.h; tensor_parallel_sharing below) and counts them once in the
// gradient norm.
//
// Bytes per layer and micro-batch on a rank (Comm counters of the tp comm: native all-gathers,
// reduce-scatters and all-reduces, their ring volume), L the padded sequence (a multiple of
// tp), B rows, d hidden, b bytes per element:
//   a dense layer: forward 2 all-gathers [(tp-1)/tp x B x L x d x b each] and 2
//   reduce-scatters [the same each], the same again in backward (each op's backward is the
//   other), i.e. 4 (tp-1)/tp x B x L x d x b per direction;
//   a sparse layer (experts on the chunk): half of that (the mixer's pair only);
//   activation checkpointing: the forward's again.
// Outside the layers per micro-batch: the embedding's all-reduce [2 (tp-1)/tp x B x L x d x b,
// forward and backward], the final hidden states' all-gather [(tp-1)/tp x B x L x d x b,
// forward and backward], and the loss's per row chunk of n rows two small all-to-alls
// [(tp-1) x n x 4 and (tp-1) x 2n x 4 bytes, forward only].
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "sharding/dist/comm.h"
#include "sharding/dist/parallel_dims.h"
#include "vlm/io/param_source.h"
#include "vlm/model/vision_language_model.h"

namespace vlm::sharding {

// What keeps `cfg` from tensor parallelism over tp ranks ("" when nothing): the model's split
// (vlm::tensor_parallel_problem) and what is not built with it yet (expert rules, LoRA are
// checked by apply_tensor_parallel).
std::string tensor_parallel_problem(const vlm::VlmConfig& cfg, int64_t tp);

// Checks that `model` was built for dims.tp() (cfg.text.tensor_parallel) and installs the
// exchange over dims.tp_comm(). tp 1: nothing.
void apply_tensor_parallel(vlm::VisionLanguageModelImpl& model, ParallelDims& dims);

// How parameter `name` of a model of `cfg` is shared over a tp group of `tp` ranks: 0 split
// (each rank's gradient whole), 1 replicated on every rank (its gradient a share to sum over
// the group), k > 1 one of k pieces each replicated on tp / k ranks (k_proj / v_proj with
// fewer key/value heads than tp: a share to sum over those ranks).
int64_t tensor_parallel_sharing(const vlm::VlmConfig& cfg, const std::string& name, int64_t tp);

// A source of rank `rank`'s slices: fill(name, lo, hi) gives elements [lo, hi) of the
// parameter's slice (vlm::tp_slice of the full tensor `full` gives), replicated parameters as
// they are. `full` reads the whole model's parameters (an HF checkpoint or the random init of
// a model of `cfg` with tensor_parallel 1); `shapes` are their full shapes.
std::unique_ptr<vlm::ParamSource> tensor_parallel_source(std::unique_ptr<vlm::ParamSource> full,
                                                         const vlm::VlmConfig& cfg,
                                                         std::map<std::string, std::vector<int64_t>> shapes,
                                                         int64_t rank, int64_t tp);

// The formula of the header comment for one decoder layer (`sparse`: experts on the chunk):
// bytes one rank sends in the layer's forward and backward, its forward counted twice when
// `recomputed`.
double tensor_parallel_layer_bytes(const vlm::TextConfig& cfg, bool sparse, int64_t tp, int64_t batch,
                                   int64_t padded, int64_t bytes_per_element, bool recomputed = false);

}  // namespace vlm::sharding
