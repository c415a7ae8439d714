// LoRA checkpoints as models (eval, export).
//
// A LoRA checkpoint (sharding/parallel/lora.h) holds the adapters, the units trained in full and
// their optimizer state, not the frozen base: trainer.json marks the frozen units
// "stored": false. To use it, build the base the run trained on (its recipe's [model]: an
// HF directory, or a preset with the run's seed), attach the adapters its lora rules
// describe (r, alpha, rslora, dropout from the recipe saved in the checkpoint), and copy in
// the checkpoint's tensors.
//
//   CheckpointReader ck(dir);
//   if (is_lora_checkpoint(ck)) {
//     LoadedModel lm = load_lora_checkpoint(ck, recipe.model, opts, recipe.source);
//   }
#pragma once
#include <string>

#include "app/train/checkpoint.h"
#include "app/config/model_source.h"
#include "app/config/recipe.h"

namespace vlm::app {

// True when the checkpoint leaves frozen units out (it was written by a LoRA run).
bool is_lora_checkpoint(const CheckpointReader& ck);

// The recipe saved in the checkpoint (<dir>/recipe.toml).
Recipe checkpoint_recipe(const CheckpointReader& ck);

// Names of the checkpoint's trained tensors that are not LoRA adapters (units trained in
// full next to the adapters, e.g. visual.merger), in checkpoint order.
std::vector<std::string> full_trained_tensors(const CheckpointReader& ck);
// The unit paths of those tensors ("visual.merger"; ep experts: their module,
// "model.layers.1.mlp.experts"): PEFT's modules_to_save.
std::vector<std::string> full_trained_units(const CheckpointReader& ck);

// base: where the frozen weights come from (an HF directory or a preset + opts.seed, as
// load_model); the tokenizer too. Adapters from the checkpoint's lora rules, values from
// the checkpoint. Throws vlm::Error naming the checkpoint when a tensor does not fit the
// base (another architecture, another size).
LoadedModel load_lora_checkpoint(const CheckpointReader& ck, const ModelSection& base, const LoadModelOptions& opts,
                                 const std::string& recipe_source = "");

// Trained tensors only: the model is built on the meta device from the checkpoint's
// config.json (no base weights read); only the adapters and the parameters of units trained
// in full hold real values (CPU, fp32). For writing a PEFT adapter.
vlm::VisionLanguageModel lora_adapters_on_meta(const CheckpointReader& ck);

}  // namespace vlm::app
