// Micro-batch tensors from tokenized samples: right padding, labels, attention mask,
// M-RoPE position ids, packed pixel values. Pure CPU code, no collectives.
//
// Names: B rows, L padded length, P patches (sum over images), N images.
#pragma once
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <vector>

#include "collate/step_plan.h"
#include "vlm/model/config.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/model/sample.h"

namespace vlm::collate {

using vlm::TokenizedSample;

struct MicroBatch {
  vlm::Batch batch;                // input_ids/attention_mask/labels [B, L], position_ids [3, B, L],
                                   // pixel_values [P, C*T*p*p], image_grid_thw [N, 3]
  torch::Tensor cu_seqlens;        // [N*t + 1] int64: vision block-diagonal boundaries (patches)
  int64_t supervised_tokens = 0;   // labels != -100 after the one-token shift
  int64_t n_images = 0;
  std::vector<int64_t> indices;    // dataset indices of the rows (empty for a filler)
  bool filler = false;             // fully masked stand-in so this rank's collectives still run
};

// Builds one micro-batch. `samples` non-empty; every sample's image pad runs must match its
// grid_thw (t*gh*gw/merge^2 ids each), checked by get_rope_index. Throws vlm::Error naming
// the sample on a length mismatch between input_ids and labels.
MicroBatch build_micro_batch(const std::vector<TokenizedSample>& samples, const VlmConfig& cfg,
                             int64_t pad_token_id);

// Padding-free packing (batch.packing): the samples back to back in ONE row [1, sum of
// lengths], no padding. batch.text_cu_seqlens [S+1] marks the samples (each attends only
// inside itself), position_ids [3, 1, L] restart at every sample (get_rope_index of the
// sample alone), and the label of each sample's first token is -100 so that no next-token
// target crosses a boundary (the unpadded build never counts it either: supervised_tokens
// and the loss equal build_micro_batch's). Images, pixel values and the vision cu_seqlens
// are those of build_micro_batch. Same checks and errors as build_micro_batch.
MicroBatch build_packed_micro_batch(const std::vector<TokenizedSample>& samples, const VlmConfig& cfg);

// Tokens in the micro-batch (rows x length, padding included) and the padding among them
// (a filler's one token is padding).
PaddingCount padding_count(const MicroBatch& mb);

// A filler micro-batch: one row of one pad token, no supervised token, no image (the model
// runs its dummy image), so every unit and collective still runs on this rank.
MicroBatch filler_micro_batch(int64_t pad_token_id);

}  // namespace vlm::collate
