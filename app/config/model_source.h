// Model + tokenizer from the recipe's [model] section: what `vlmtrain eval` (and the
// trainer) build before sharding.
//
//   ModelSection m = recipe.model;                  // preset or HF path (+ tokenizer)
//   LoadedModel lm = load_model(m, {seed, device, dtype});
//   lm.model->...; lm.tokenizer->...; lm.description   // "preset tiny (random init, seed 0)"
//
// Special token ids: an HF config.json carries the ids of <|image_pad|>, <|vision_start|>,
// <|vision_end|>; they must agree with the tokenizer (error otherwise). A preset's ids are
// placeholders at the top of its vocabulary: they are overwritten from the tokenizer
// (use_tokenizer_special_ids), which must fit in the preset's vocabulary.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "app/config/recipe.h"
#include "vlm/model/config.h"
#include "vlm/io/param_source.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/text/tokenizer.h"

namespace vlm::app {

// model.tokenizer when set, else model.path. Throws vlm::Error (naming the recipe key) when
// neither is set.
std::string tokenizer_path(const ModelSection& model, const std::string& recipe_source = "");

// Overwrites cfg's special token ids with the tokenizer's: <|image_pad|>, <|vision_start|>,
// <|vision_end|> (required), <|im_end|> as eos (required), <|endoftext|> as bos and
// <|video_pad|> (when the tokenizer has them; a missing <|video_pad|> gets the image id,
// which generation already never picks). Throws vlm::Error when a required token is
// missing or the tokenizer has more ids than cfg.text.vocab_size.
void use_tokenizer_special_ids(vlm::VlmConfig& cfg, const vlm::Tokenizer& tok);

// Checks that an HF config's image / vision-start / vision-end ids are the tokenizer's;
// throws vlm::Error naming the token, both ids and `source`.
void check_tokenizer_special_ids(const vlm::VlmConfig& cfg, const vlm::Tokenizer& tok,
                                 const std::string& source);

struct LoadModelOptions {
  uint64_t seed = 0;                      // preset models: materialize() seed
  torch::Device device = torch::kCPU;
  torch::Dtype dtype = torch::kFloat32;   // parameter dtype
  // Leave the model on the meta device and return a ParamSource instead of the weights:
  // apply_policies(model, opts, dims, source) then materialises on each rank only what it
  // keeps (sharding/parallel/sharded_load.h). Everything about the checkpoint is checked here all
  // the same (files, names, shapes, tied head).
  bool deferred = false;
  // Tensor parallelism (dist.tp; needs deferred): the model is built with
  // cfg.text.tensor_parallel = tp and `source` gives rank tp_rank's slices of the weights
  // (sharding/parallel/tensor_parallel.h).
  int64_t tp = 1, tp_rank = 0;
};

struct LoadedModel {
  vlm::VisionLanguageModel model{nullptr};
  std::unique_ptr<vlm::Tokenizer> tokenizer;
  std::string description;  // "HF /models/x (2 safetensors files)" | "preset tiny (random init, seed 0)"
  bool random_init = false; // a preset: nothing was loaded
  // With LoadModelOptions::deferred: the weights (model on the meta device until
  // apply_policies materialises it); null otherwise.
  std::unique_ptr<vlm::ParamSource> source;
  // With tp > 1: the whole model on the meta device, which `source` reads through (it must
  // outlive the source).
  vlm::VisionLanguageModel whole{nullptr};
};

// Builds the model of `model` (preset: random init on opts.device; path: config.json +
// safetensors loaded) with the tokenizer of tokenizer_path(model). Every rank calls it
// independently (no collectives); the same inputs give the same weights on every rank.
LoadedModel load_model(const ModelSection& model, const LoadModelOptions& opts,
                       const std::string& recipe_source = "");

}  // namespace vlm::app
