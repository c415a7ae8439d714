// The composed vision-language model of every registered family (Qwen2-VL, Qwen2.5-VL,
// Qwen3-VL): `visual` (the family's vision tower, from the registry: vlm/families/registry.h),
// `model` (text decoder), `lm_head` (absent when tied: the head then computes with
// model.embed_tokens.weight, so named_parameters() never counts the embedding twice).
//
// Names: B batch, L tokens, P patches, N images, M merged image tokens, d hidden, V vocab.
// Units run through the UnitRunner in this fixed order (= units()):
//   visual.* (the tower's units: patch_embed, [pos_embed,] blocks.0.. [with
//   deepstack_merger_list.k], merger), model.embed_tokens, model.layers.0.., model.norm, lm_head
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "vlm/model/config.h"
#include "vlm/model/language_model.h"
#include "vlm/model/layers.h"
#include "vlm/model/pipeline_stage.h"
#include "vlm/model/sequence_parallel.h"
#include "vlm/model/unit_runner.h"
#include "vlm/model/vision_tower.h"

namespace vlm {

struct Batch {
  torch::Tensor input_ids;       // [B, L] int64
  torch::Tensor attention_mask;  // [B, L] 1 = real, 0 = padding; undefined = all real
  torch::Tensor labels;          // [B, L] int64, -100 = ignored; unshifted (token t predicts t+1)
  torch::Tensor position_ids;    // [3, B, L] int64; undefined = computed by get_rope_index
  torch::Tensor pixel_values;    // [P, C*T*P*P]; undefined or 0 rows = no image
  torch::Tensor image_grid_thw;  // [N, 3] int64 (t, gh, gw) in patches; kept on the host
  // Optional, computed on the host by collate so that the device never has to tell the host
  // a count inside the forward:
  torch::Tensor loss_rows;       // [n] int64: flat positions b*(L-1)+t whose next-token label
                                 // labels[b, t+1] is supervised; undefined = derived from labels
  torch::Tensor image_rows;      // [M] int64: flat positions b*L+t of the image pad tokens, in
                                 // order (image features go there by index: no data-dependent
                                 // shape in forward or backward); undefined = found from input_ids
  bool right_padded = false;     // padding (if any) only at row ends: the LLM attends causally
                                 // without a mask tensor (flash attention on CUDA)
  // Padding-free packing (collate's batch.packing): B == 1 and the row holds S whole samples
  // back to back; sample i is tokens [c[i], c[i+1]) and attends (causally) only inside
  // itself. position_ids restart per sample; labels of each sample's first token are -100,
  // so no next-token target crosses a boundary. Kept on the host; undefined = not packed.
  torch::Tensor text_cu_seqlens; // [S + 1] int64: 0, ..., L
  // Mixture of experts: the weight backward gives this micro-batch's load-balancing loss
  // (moe.h), i.e. d objective / d aux_loss; the trainer passes router_aux_loss_coef / (the
  // step's micro-batches on all ranks). 0: no aux loss (dense models ignore it).
  double router_aux_weight = 0;
};

// loss_rows of labels [B, L] (host): the flat indices of labels[:, 1:] != -100.
torch::Tensor supervised_rows(const torch::Tensor& labels);
// image_rows of input_ids [B, L] (host): the flat indices of input_ids == image_token_id.
torch::Tensor image_token_rows(const torch::Tensor& input_ids, int64_t image_token_id);

struct ForwardOutput {
  torch::Tensor loss_sum;  // fp32 scalar: sum of token cross-entropies over supervised tokens
  int64_t n_tokens = 0;    // supervised tokens (labels != -100 after the shift)
  torch::Tensor logits;    // [B, L, V] fp32, only when requested
  // Mixture of experts with router_aux_weight != 0: HF's aux_loss (fp32 scalar, a value: its
  // gradient is attached inside the sparse layers, not through loss_sum).
  torch::Tensor aux_loss;
};

class VisionLanguageModelImpl : public torch::nn::Module {
 public:
  // opts.device may be torch::kMeta (no memory; vlm::materialize() afterwards).
  explicit VisionLanguageModelImpl(const VlmConfig& cfg, const torch::TensorOptions& opts = torch::TensorOptions());

  // Training / scoring forward. Without an image in the batch, a dummy 1x2x2 image runs
  // through the whole vision tower and enters loss_sum multiplied by 0, so every call runs
  // every unit. loss_sum is defined only when labels are given.
  // With a sequence exchange of cp > 1 ranks (set_sequence_exchange), the training path
  // (labels, no logits) runs the decoder on this rank's tokens of the sequence (one chunk,
  // or two in ring mode: sequence_parallel.h): loss_sum is this rank's part of the
  // micro-batch's loss (the cp ranks' parts sum to it), n_tokens the micro-batch's supervised
  // tokens (all ranks').
  // Every rank of the group must run the same micro-batch. Logits and generation do not split.
  ForwardOutput forward(const Batch& batch, bool return_logits = false);

  void set_runner(std::shared_ptr<UnitRunner> runner);
  // Sequence parallelism: the context-parallel group's exchange (sharding/ installs it; null
  // or size 1 = none).
  void set_sequence_exchange(std::shared_ptr<SequenceExchange> exchange) { sp_ = std::move(exchange); }
  SequenceExchange* sequence_exchange() const { return sp_.get(); }
  // Tensor parallelism: the tensor-parallel group's exchange (tensor_parallel.h; sharding/
  // installs it on a model built with cfg.text.tensor_parallel = its size).
  void set_tensor_exchange(std::shared_ptr<SequenceExchange> exchange);
  SequenceExchange* tensor_exchange() const { return tp_.get(); }
  // Pipeline parallelism (pipeline_stage.h): this model computes one stage (the decoder runs
  // the stage's layers; forward_stage replaces forward for training). Set before sharding, so
  // that the other stages' units are never materialised here.
  void set_pipeline_stage(const PipelineStage& stage);
  const PipelineStage& pipeline_stage() const { return stage_; }
  // The training forward of this pipeline stage on one micro-batch (labels given). input: the
  // previous stage's output [B, L, d] (undefined on stage 0, which embeds the batch; under
  // tensor parallelism this rank's sequence chunk [B, L / tp, d], L padded to a multiple of tp,
  // tensor_parallel.h). Not the last stage: returns .hidden [B, L, d] (tp: the chunk), the
  // residual stream after its layers (stage 0 with
  // the dummy image's zero term added, so that its backward reaches the vision tower); the
  // last stage: .out as forward()'s (loss_sum, n_tokens). Every stage computes positions,
  // masks and packing boundaries from the host batch itself. Not with context parallelism or
  // the MoE load-balancing loss.
  struct StageOutput {
    torch::Tensor hidden;
    ForwardOutput out;
  };
  StageOutput forward_stage(const Batch& batch, const torch::Tensor& input);
  UnitRunner& runner() { return *runner_; }
  // Ordered unit table (call order of forward) for sharding.
  std::vector<Unit> units();

  // --- building blocks (also used by generation) ---
  // Image features [M, d] in merge-block order, and the DeepStack features (units visual.*).
  // sp: the patches split over a context-parallel group (vision_split.h), every feature back
  // on every rank; null: whole.
  VisionOutput image_features(const torch::Tensor& pixel_values, const torch::Tensor& grid_thw,
                              SequenceExchange* sp = nullptr);
  // Token embeddings with image features spliced in at image_token_id positions: [B, L, d].
  // With dummy_vision and no image, runs the dummy image and returns the sum of its
  // features (DeepStack ones included) times 0 in *zero_term (a scalar to add to the loss).
  // deepstack (optional): filled with the image positions and DeepStack features for
  // LanguageModel::forward (left empty without images or for families without DeepStack).
  // sp: image_features' (the tower split over a context-parallel group).
  torch::Tensor embed_inputs(const Batch& batch, bool dummy_vision, torch::Tensor* zero_term,
                             DeepStackInputs* deepstack = nullptr, SequenceExchange* sp = nullptr);
  // hidden: [..., d] -> logits [..., V] in the activation dtype (unit lm_head; tensor
  // parallelism: gathered over the vocabulary slices).
  torch::Tensor head(const torch::Tensor& hidden);
  // Summed cross-entropy of head(hidden) against labels, chunked (unit "lm_head"; tensor
  // parallelism: vocabulary-parallel, every rank the same hidden and labels).
  // hidden: [n, d], labels: [n] int64 -> fp32 scalar
  torch::Tensor head_loss(const torch::Tensor& hidden, const torch::Tensor& labels);

  VlmConfig cfg;
  std::shared_ptr<VisionTowerImpl> visual;
  LanguageModel model{nullptr};
  Linear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  // The training path on this rank's tokens (forward's sp branch; sequence_layout of the
  // exchange's mode): embeds [B, L, d] and pos [3, B, L] of the whole micro-batch, mask
  // [B, L] or undefined (causal), text_cu the packed row's boundaries (empty: not packed).
  ForwardOutput forward_chunk(const Batch& batch, torch::Tensor embeds, torch::Tensor pos, torch::Tensor mask,
                              std::vector<int64_t> text_cu, const DeepStackInputs& deepstack);

  // The training loss of the final hidden states [B, L, d] (forward's head-only-on-supervised
  // rows path): loss_sum and n_tokens.
  ForwardOutput training_loss(const Batch& batch, const torch::Tensor& hidden);
  // Positions [3, B, L] (the batch's, or get_rope_index / packed_position_ids), the attention
  // mask [B, L] or undefined (causal: right-padded or packed), the packed row's boundaries.
  struct DecoderInputs {
    torch::Tensor pos, mask, full_mask;
    std::vector<int64_t> text_cu;
  };
  DecoderInputs decoder_inputs(const Batch& batch, int64_t b, int64_t l);

  PipelineStage stage_;
  std::shared_ptr<UnitRunner> runner_;
  std::shared_ptr<SequenceExchange> sp_;
  std::shared_ptr<SequenceExchange> tp_;
};
TORCH_MODULE(VisionLanguageModel);

}  // namespace vlm
