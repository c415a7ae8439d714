// LoRA adapters on vlm::Linear, as PEFT defines them (peft.tuners.lora.Linear):
//
//   y = x W^T + b + scaling * dropout(x) A^T B^T      A = lora_A.weight [r, in]
//   scaling = alpha / r   (alpha / sqrt(r) with rslora)  B = lora_B.weight [out, r]
//
//   vlm::LoraOptions o;  o.r = 8;  o.alpha = 16;
//   vlm::add_lora(*layer->self_attn->q_proj, o, seed, "model.layers.0.self_attn.q_proj");
//   // named_parameters(): ...q_proj.weight (base), ...q_proj.lora_A.weight, ...q_proj.lora_B.weight
//   vlm::merge_lora(*q_proj);   // W += scaling * B A, adapters removed
//
// The adapters are submodules named lora_A / lora_B (vlm::Linear without bias), so the
// parameter names are PEFT's saved names without the adapter name ("default"), and the base
// keeps its HF names (a base checkpoint loads unchanged). They take the base weight's dtype
// and device (meta stays meta: plan). Initialisation as PEFT's init_lora_weights: A
// kaiming-uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)) (init = "kaiming", PEFT True)
// or N(0, 1/r) (init = "gaussian", PEFT "gaussian"), drawn on the CPU in fp32 from a stream
// seeded by (seed, full parameter name); B zeros, so a fresh adapter changes nothing.
//
// PEFT adapter files name a tensor "base_model.model.<module>.lora_A.weight" with the
// module under transformers' nested names (model.language_model.layers.0.self_attn.q_proj);
// peft_tensor_name / canonical_from_peft convert (vlm/io/hf_checkpoint.h canonical names).
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "vlm/model/layers.h"

namespace vlm {

// LoraInit and LoraOptions are declared in vlm/model/layers.h (LinearImpl keeps its adapter's options).
const char* lora_init_name(LoraInit i);
LoraInit parse_lora_init(const std::string& s);  // throws vlm::Error listing the choices

// Adds lora_A / lora_B to `linear` (which must not have them yet). `name` is the module's
// full path, used for the seed of A and in errors.
void add_lora(LinearImpl& linear, const LoraOptions& o, uint64_t seed, const std::string& name);
bool has_lora(const LinearImpl& linear);
// The initial value of `linear`'s adapter parameter "lora_A.weight" or "lora_B.weight" (fp32,
// CPU): what add_lora gives it (a meta base gets meta adapters; this materialises them).
// `name` is the module's full path, as passed to add_lora.
torch::Tensor lora_init_value(const LinearImpl& linear, const std::string& which, const std::string& name);
// W += scaling * B A (computed in fp32, stored in W's dtype); removes the adapters.
void merge_lora(LinearImpl& linear);

// Every vlm::Linear below `root` (full paths relative to root), in registration order;
// the adapters themselves (lora_A / lora_B) excluded.
std::vector<std::pair<std::string, LinearImpl*>> linear_modules(torch::nn::Module& root);
// The Linear modules under root that carry an adapter.
std::vector<std::pair<std::string, LinearImpl*>> lora_modules(torch::nn::Module& root);
// Merges every adapter under root; returns how many.
int64_t merge_all_lora(torch::nn::Module& root);

// True for "<...>.lora_A.weight" / "<...>.lora_B.weight".
bool is_lora_param(const std::string& name);
// Canonical parameter name ("model.layers.0.self_attn.q_proj.lora_A.weight") -> PEFT's
// saved name ("base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight").
std::string peft_tensor_name(const std::string& canonical);
// The reverse; also accepts the legacy module names (base_model.model.model.layers.0...)
// and an adapter name before ".weight" (".lora_A.default.weight"). Throws vlm::Error for a
// name that is not a LoRA tensor of a PEFT adapter.
std::string canonical_from_peft(const std::string& peft_name);

}  // namespace vlm
