// Debugging aid: the exact micro-batches a training step consumed, written to disk.
//
// VLMTRAIN_DUMP_BATCHES=DIR makes every rank write, before the forward of each step,
//   DIR/step-<N>.rank-<R>.mb-<K>.safetensors
// holding the tensors the model receives (input_ids, attention_mask, labels [B, L] int64;
// position_ids [3, B, L] int64; pixel_values [P, C*T*p*p] (1176 Qwen2, 1536 Qwen3) and
// image_grid_thw [N, 3] when the micro-batch has images; text_cu_seqlens [S+1] int64 for a
// packed row, batch.packing) and metadata {step, rank,
// micro_batch, micro_batches, filler, supervised_tokens}. Users replay a step in another
// framework with it; the HF training parity test (tests/app/train/train_hf_parity_dist_test.cpp)
// feeds them to transformers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "collate/micro_batch.h"

namespace vlm::app {

// The directory from VLMTRAIN_DUMP_BATCHES ("" when unset); created when set.
std::string batch_dump_dir();

// Writes this rank's micro-batches of `step` (1-based) into `dir`.
void dump_micro_batches(const std::string& dir, int64_t step, int rank,
                        const std::vector<vlm::collate::MicroBatch>& mbs);

}  // namespace vlm::app
