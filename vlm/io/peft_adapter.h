// PEFT LoRA adapter directories: read, apply to a model, write (peft 0.21's
// save_pretrained / PeftModel.from_pretrained format).
//
//   <dir>/adapter_config.json        {"peft_type": "LORA", "r": 8, "lora_alpha": 16, ...}
//   <dir>/adapter_model.safetensors  base_model.model.<module>.lora_A.weight   [r, in]
//                                    base_model.model.<module>.lora_B.weight   [out, r]
//
//   vlm::PeftAdapter a = vlm::read_peft_adapter("runs/adapter");  // validated, tensors on CPU
//   vlm::apply_peft_adapter(*model, a);             // add_lora + copy values, per module
//   vlm::write_peft_adapter(*model, "out/adapter", "Qwen/Qwen2-VL-2B-Instruct");
//
// Module names. In the files, <module> is transformers 5's nested name
// (model.language_model.layers.0.self_attn.q_proj, model.visual.blocks.0.attn.qkv);
// adapters saved with transformers 4 use the legacy names (model.layers.0..., visual.blocks.0...)
// and read the same. PeftAdapter and the model speak canonical names (vlm/io/hf_checkpoint.h).
//
// Per-module rank and alpha, as peft.tuners.lora.LoraModel._create_and_replace resolves them
// (peft.utils.other.get_pattern_key): the first key K of rank_pattern (alpha_pattern), in
// file order, with re.match(rf"(.*\.)?({K})$", module) gives the module's r (lora_alpha);
// no match: the top-level r (lora_alpha). The module name matched is the nested one (what
// PEFT 0.21 with transformers 5 sees); for a legacy-named adapter the name as stored is tried
// too. Keys are compiled as ECMAScript regexes (std::regex), which agree with Python's re on
// what pattern keys use (literals, escapes, classes, groups, alternation, anchors,
// quantifiers); a Python-only construct ((?P<n>...), lookbehind) is an error naming the key.
//
// Read-side checks (vlm::Error naming the file and the problem): missing files (a pickled
// adapter_model.bin is named, not read), invalid JSON, peft_type != "LORA", and every setting
// that changes the forward beyond y += scaling * B A x: use_dora, bias != "none",
// modules_to_save, fan_in_fan_out, lora_bias, layer_replication, target_parameters,
// trainable_token_indices, the LoRA variants (alora, arrow, kasa, monteclora, bdlora, qalora),
// and init_lora_weights that rewrite the base weights when PEFT creates the adapter (pissa,
// corda, olora, loftq, lora_ga). Tensors: only <module>.lora_A/lora_B.weight (an adapter
// name, ".lora_A.default.weight", is accepted), each module with both, 2-D floating
// tensors, A [r, in] and B [out, r] with r the module's resolved rank.
#pragma once
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "vlm/model/layers.h"

namespace vlm {

// One adapted module.
struct PeftModuleAdapter {
  std::string module;       // canonical path: "model.layers.0.self_attn.q_proj", "visual.blocks.0.attn.qkv"
  std::string peft_module;  // as stored, without "base_model.model.": "model.language_model.layers.0..."
  LoraOptions options;      // r and alpha resolved for this module; dropout, rslora, init from the config
  torch::Tensor lora_A;     // [r, in], stored dtype, CPU
  torch::Tensor lora_B;     // [out, r]
};

struct PeftAdapter {
  std::string dir;                      // where it was read from
  std::string base_model_name_or_path;  // "" when null
  // target_modules as written (information only: the tensors decide which modules get an
  // adapter). A list is kept as is; a string (PEFT: re.fullmatch) becomes one entry.
  std::vector<std::string> target_modules;
  LoraOptions defaults;                                      // r, lora_alpha, lora_dropout, use_rslora, init
  std::vector<std::pair<std::string, int64_t>> rank_pattern;  // in file order
  std::vector<std::pair<std::string, double>> alpha_pattern;  // in file order
  std::vector<PeftModuleAdapter> modules;                    // in the file's name order
  // modules_to_save: modules trained in full beside the adapters (e.g. the merger), as
  // written (PEFT: a module matches an entry when its name is the entry or ends with
  // "." + entry), and their tensors under canonical parameter names (stored dtype, CPU).
  std::vector<std::string> modules_to_save;
  std::vector<std::pair<std::string, torch::Tensor>> saved_tensors;
};

// Reads and validates <dir>/adapter_config.json and <dir>/adapter_model.safetensors.
PeftAdapter read_peft_adapter(const std::string& dir);

// For each adapted module: the vlm::Linear at its canonical path gets add_lora(options) and
// the adapter's values, cast to the base weight's dtype and device; each saved_tensors entry
// is copied into the model's parameter of that name (shape checked). Everything is checked
// before the first change (error naming the module: no such Linear, in/out disagreeing
// with the base weight, an adapter already present, a base on the meta device).
void apply_peft_adapter(torch::nn::Module& model, const PeftAdapter& adapter);

// Writes every adapter under `model` (vlm/model/lora.h lora_modules) as a PEFT adapter directory:
// adapter_model.safetensors (PEFT names, each tensor in the dtype it is held in) and an
// adapter_config.json that peft 0.21 loads to the same forward:
//   target_modules  the nested names of the adapted modules;
//   r, lora_alpha   the most common values; rank_pattern / alpha_pattern entries
//                   "^<escaped nested name>" for the modules that differ, which PEFT resolves
//                   to exactly that module;
//   use_rslora      the most common setting; a module with the other setting gets the
//                   alpha that gives it the same scaling (alpha / r = alpha' / sqrt(r));
//   lora_dropout    the most common value (PEFT has one); init_lora_weights likewise
//                   (true for kaiming, "gaussian").
// The files go into a temp directory beside `dir` (with hard links to any other files of
// an existing `dir`), are fsynced, and replace `dir` in one rename exchange (two renames
// where the filesystem lacks it, the old directory moved aside first and removed last),
// so a failure never leaves a half-written adapter in place of a good one.
// modules_to_save: canonical module paths (e.g. "visual.merger") whose parameters are written
// in full beside the adapters, under PEFT's names, and listed (nested names) in the config's
// modules_to_save, which PeftModel.from_pretrained loads into the base.
void write_peft_adapter(torch::nn::Module& model, const std::string& dir,
                        const std::string& base_model_name_or_path,
                        const std::vector<std::string>& modules_to_save = {});

}  // namespace vlm
