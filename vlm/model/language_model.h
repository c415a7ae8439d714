// `model`: the Qwen2 / Qwen3 / Qwen3.5 text decoder with M-RoPE: embed_tokens, layers.N, norm. The head
// (`lm_head`, possibly tied to embed_tokens) lives in the composed model (vision_language_model.h).
//
// Names: B batch, L new tokens, P cached tokens, T = P + L keys, d hidden, D head_dim.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "vlm/model/attention.h"
#include "vlm/model/config.h"
#include "vlm/model/decoder_layer.h"
#include "vlm/model/layers.h"
#include "vlm/model/moe.h"
#include "vlm/model/unit_runner.h"

namespace vlm {

// What every layer keeps for cached decoding (keys / values, or linear-attention state).
struct KvCache {
  std::vector<LayerCache> layers;
  int64_t tokens = 0;  // tokens seen so far (the cached length)
  int64_t length() const { return tokens; }
};

// Causal + key-padding mask. attention_mask: [B, T] (1 = real token); the L queries sit at
// key positions P..T-1. Returns bool [B, 1, L, T]: query i may attend key j when j <= P + i
// and key j is real; a query always attends itself, so no row is empty (padding rows are
// ignored by the loss anyway).
torch::Tensor causal_padding_mask(const torch::Tensor& attention_mask, int64_t num_queries);

// DeepStack (Qwen3-VL): after decoder layer k < embeds.size(), embeds[k] is added to the
// hidden states at the image positions (mask true, in order).
struct DeepStackInputs {
  torch::Tensor mask;                 // [B, L] bool: image-token positions (when rows is undefined)
  torch::Tensor rows;                 // [M] int64 on the device: their flat positions b*L+t
  std::vector<torch::Tensor> embeds;  // each [M, d]; dense: each [B, L, d], added whole
  bool dense = false;                 // (sequence parallelism: a chunk's features, zero elsewhere)
};

class LanguageModelImpl : public torch::nn::Module {
 public:
  LanguageModelImpl(const TextConfig& cfg, const torch::TensorOptions& opts);
  // input_ids: [B, L] -> embeddings [B, L, d] (unit "<prefix>.embed_tokens"); tp: the
  // vocabulary-parallel lookup over the tensor-parallel group (tensor_parallel.h).
  torch::Tensor embed(const torch::Tensor& input_ids, UnitRunner& runner, const std::string& prefix = "model",
                      SequenceExchange* tp = nullptr);
  // embeds: [B, L, d]; position_ids: [3, B, L]; attention_mask: [B, T] (T = cached + L),
  // or undefined for plain causal attention without a mask tensor (no cache; rows whose
  // padding, if any, is at the end: right padding); cache: optional, extended in place
  // -> final-normed hidden states [B, L, d]
  // (units "<prefix>.layers.N", "<prefix>.norm"). deepstack: optional (Qwen3-VL), added
  // between the layer units. text_cu_seqlens: optional [S + 1] (0 .. L) for a packed row
  // (B == 1, no mask, no cache): each sample attends causally inside itself only.
  // aux: optional (mixture of experts): the forward's load-balancing state; every sparse layer
  // records its routing there and attaches the aux-loss gradient (moe.h), finished here.
  // sp: optional (sequence parallelism, sequence_parallel.h; no cache, no aux): embeds,
  // position_ids and deepstack are this rank's L / cp tokens (sequence_layout of sp's mode);
  // attention_mask and text_cu_seqlens the whole (padded) sequence's -> this rank's [B, L / cp, d].
  // tp: the tensor-parallel group (tensor_parallel.h; no sp, no aux). Every rank gives the
  // same whole inputs and gets the same whole output [B, L, d]; without a cache the layers run
  // in the sequence-parallel layout (forward_tp_sequence), with one whole. Under pipeline
  // parallelism the stages exchange the rank's sequence chunk instead (forward_tp_sequence).
  torch::Tensor forward(const torch::Tensor& embeds, const torch::Tensor& position_ids,
                        const torch::Tensor& attention_mask, KvCache* cache, UnitRunner& runner,
                        const std::string& prefix = "model", const DeepStackInputs* deepstack = nullptr,
                        const std::vector<int64_t>* text_cu_seqlens = nullptr,
                        const std::shared_ptr<RouterAuxState>& aux = nullptr, SequenceExchange* sp = nullptr,
                        SequenceExchange* tp = nullptr);
  // Pipeline parallelism (pipeline_stage.h): forward runs layers [first, end) only (end -1:
  // through the last) and the final norm only when `norm`; a stage that does not run it
  // returns the residual stream. Default: every layer and the norm.
  void set_layer_range(int64_t first, int64_t end, bool norm);

  TextConfig cfg;
  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers_list{nullptr};  // registered as "layers"
  std::vector<DecoderLayer> layers;
  Norm norm{nullptr};

 private:
  // The training forward under tensor parallelism: pads the sequence to a multiple of tp,
  // runs the layers on this rank's chunk (sequence_chunk) and gathers the normed result.
  // Pipeline parallelism: a stage after the first takes this rank's chunk [B, L / tp, d] as
  // `embeds` (L from position_ids), a stage before the last returns its chunk ungathered.
  torch::Tensor forward_tp_sequence(torch::Tensor embeds, torch::Tensor position_ids, torch::Tensor attention_mask,
                                    UnitRunner& runner, const std::string& prefix, const DeepStackInputs* deepstack,
                                    const std::vector<int64_t>* text_cu_seqlens, SequenceExchange& tp);
  int64_t first_layer_ = 0, end_layer_ = -1;
  bool final_norm_ = true;
  int64_t end_layer() const { return end_layer_ < 0 ? static_cast<int64_t>(layers.size()) : end_layer_; }
};
TORCH_MODULE(LanguageModel);

}  // namespace vlm
