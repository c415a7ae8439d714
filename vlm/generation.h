// Batched autoregressive generation with a KV cache (greedy, or temperature + top-p
// sampling) and stop tokens; what eval uses. Every unit still runs through the model's
// UnitRunner, so a sharded model generates the same way.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "vlm/qwen2_vl.h"

namespace vlm {

struct GenerationOptions {
  int64_t max_new_tokens = 64;
  std::vector<int64_t> stop_tokens;  // a sequence ends after emitting one of these
  double temperature = 0.0;          // 0 = greedy (argmax)
  double top_p = 1.0;                // nucleus sampling mass when temperature > 0
  uint64_t seed = 0;                 // sampling stream
  int64_t pad_token_id = 0;          // fed (and reported) after a sequence has stopped
  bool use_cache = true;             // false: recompute the whole sequence every step
  bool keep_logits = false;          // return the logits of every step
  // Keep stepping to max_new_tokens even when every sequence has stopped, so that all
  // ranks of a sharded model issue the same number of unit calls.
  bool run_to_max = false;
  // Run a dummy image through the vision tower when the prompt has none (sharded eval).
  bool dummy_vision = false;
  // Lockstep early stop for sharded eval: when set, it is called once after every step with
  // whether every sequence of THIS call has stopped, and generation ends as soon as it
  // returns true (run_to_max is then ignored). Sharded eval passes an all-reduce over ranks
  // ("have all ranks stopped?"), so every rank makes the same number of steps (the same unit
  // calls) and they all stop at the first step where every rank is done. It must give
  // the same answer on every rank.
  std::function<bool(bool all_stopped_here)> stop_together;
};

struct GenerationOutput {
  // Generated tokens per sequence, stop token included, nothing after it.
  std::vector<std::vector<int64_t>> tokens;
  torch::Tensor logits;  // [B, steps, V] fp32 when keep_logits
};

// prompt: input_ids [B, L] LEFT-padded, attention_mask [B, L], pixel_values /
// image_grid_thw for the images in the prompts (labels and position_ids ignored).
GenerationOutput generate(Qwen2VLImpl& model, const Batch& prompt, const GenerationOptions& opts);

}  // namespace vlm
