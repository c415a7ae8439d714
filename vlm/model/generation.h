// Batched autoregressive generation with a KV cache (greedy, or temperature + top-k + top-p
// sampling), HF's repetition penalty and stop tokens; what eval uses. Every unit still runs
// through the model's UnitRunner, so a sharded model generates the same way.
//
// Settings come from the model directory's generation_config.json (GenerationConfig, HF's
// defaults for absent keys), which eval may override key by key (app/eval/evaluator.h), and
// become GenerationOptions via to_options(). Per step, as HF's generate: logits (fp32) ->
// repetition penalty -> greedy argmax, or temperature -> top-k -> top-p -> sample.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "vlm/model/vision_language_model.h"

namespace vlm {

// generation_config.json of an HF model directory. Absent keys (or no file) take the
// defaults of transformers 5.23's GenerationConfig, so an empty file means greedy decoding.
struct GenerationConfig {
  bool do_sample = false;           // false: greedy; the three keys below are then unused
  double temperature = 1.0;         // sampling: logits / temperature (> 0)
  int64_t top_k = 50;               // sampling: keep the k largest logits; 0 = off
  double top_p = 1.0;               // sampling: smallest set with mass >= top_p; 1 = off
  double repetition_penalty = 1.0;  // > 0; 1 = off (HF RepetitionPenaltyLogitsProcessor)
  std::vector<int64_t> eos_token_ids;   // "eos_token_id", an integer or a list; empty = absent
  std::optional<int64_t> pad_token_id;  // "pad_token_id"
  std::string source;               // the file read; "" = none (built-in defaults)

  nlohmann::json to_json() const;   // the keys above (eos as a list), plus "source"
};

// Parses the text of a generation_config.json; keys other than the ones above are ignored
// (they steer features vlmtrain does not have: beams, min_length, ...). Throws vlm::Error
// naming `source` and the key for a wrong type or range.
GenerationConfig parse_generation_config(const std::string& json_text, const std::string& source);
// <dir>/generation_config.json when it exists, else the defaults (source "").
GenerationConfig load_generation_config(const std::string& model_dir);

struct GenerationOptions {
  int64_t max_new_tokens = 64;
  std::vector<int64_t> stop_tokens;  // a sequence ends after emitting one of these
  double temperature = 0.0;          // 0 = greedy (argmax)
  int64_t top_k = 0;                 // sampling: keep the top_k largest logits; 0 = all
  double top_p = 1.0;                // nucleus sampling mass when temperature > 0
  // HF's repetition penalty: each token already in the row (its prompt from the first
  // unmasked column on, and every token generated so far) has its logit divided by the
  // penalty when > 0, multiplied when < 0. 1 = off.
  double repetition_penalty = 1.0;
  // Never pick <|image_pad|> / <|video_pad|> (a generated pad would have no image behind
  // it). HF's generate has no such rule; parity tests turn it off.
  bool suppress_vision_pads = true;
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

// The options generation_config `gc` asks for: greedy unless do_sample (then temperature,
// top_k, top_p), the repetition penalty, stop tokens = gc.eos_token_ids (callers may add
// more), pad = gc.pad_token_id when set. max_new_tokens and the rest keep `base`'s values.
GenerationOptions to_options(const GenerationConfig& gc, GenerationOptions base = {});

// prompt: input_ids [B, L] LEFT-padded, attention_mask [B, L], pixel_values /
// image_grid_thw for the images in the prompts (labels and position_ids ignored).
GenerationOutput generate(VisionLanguageModelImpl& model, const Batch& prompt, const GenerationOptions& opts);

}  // namespace vlm
