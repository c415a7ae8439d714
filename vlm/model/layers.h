// Leaf layers that can be built on the meta device (no memory) and materialised later:
// Linear, Norm (LayerNorm / RMSNorm), Embedding, PatchEmbed (Conv3d as a matmul).
//
// LibTorch's torch::nn::Linear / Embedding allocate and initialise real CPU memory in
// reset(), which would need ~30 GB just to plan a 7B model; these create their parameters
// with torch::empty(shape, options), where options.device() may be torch::kMeta.
// Parameter names match HF (`weight`, `bias`). vlm::materialize() (meta_init.h) replaces
// meta parameters with real tensors and initialises them through LayerBase.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "vlm/model/layer_kinds.h"

namespace vlm {

// How materialize() initialises one parameter.
enum class ParamInit { normal, zeros, ones };

// Base of every leaf layer that owns parameters.
class LayerBase : public torch::nn::Module {
 public:
  // Initialisation rule for the parameter `name` registered by this layer.
  virtual ParamInit init_rule(const std::string& name) const = 0;
  // Replaces the registered parameter `name` by `value` (same shape; requires_grad kept).
  // Needed because set_data() refuses to swap a meta tensor for a real one.
  void replace_parameter(const std::string& name, torch::Tensor value);

 protected:
  // Re-reads the member tensor handles from the registered parameters.
  virtual void rebind() = 0;
};

// LoRA adapter options (vlm/model/lora.h: add_lora; methods defined in lora.cpp).
enum class LoraInit {
  kaiming,   // A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0   (PEFT init_lora_weights = true)
  gaussian,  // A ~ N(0, 1/r), B = 0                     (PEFT init_lora_weights = "gaussian")
};
struct LoraOptions {
  int64_t r = 8;          // rank (lora_A rows), >= 1
  double alpha = 16;      // lora_alpha
  double dropout = 0;     // lora_dropout on the adapter's input, training mode only, in [0, 1)
  bool rslora = false;    // use_rslora: scaling = alpha / sqrt(r) instead of alpha / r
  LoraInit init = LoraInit::kaiming;
  double scaling() const;
  void validate(const std::string& where) const;  // throws vlm::Error naming `where`
};

// y = x W^T + b.  weight: [out, in], bias: [out].
// With a LoRA adapter (vlm/model/lora.h add_lora): y = x W^T + b + scaling * dropout(x) A^T B^T,
// A = lora_A.weight [r, in], B = lora_B.weight [out, r] (submodules named as PEFT's).
class LinearImpl : public LayerBase {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias, const torch::TensorOptions& opts);
  // x: [..., in] -> [..., out]
  torch::Tensor forward(const torch::Tensor& x);
  // The adapter's term scaling * dropout(x) A^T B^T in the adapter's dtype (needs lora_A).
  // x: [..., in] -> [..., out]
  torch::Tensor lora_delta(const torch::Tensor& x);
  ParamInit init_rule(const std::string& name) const override;
  torch::Tensor weight, bias;  // bias undefined when built without
  // LoRA adapter (vlm/model/lora.h): null without one.
  std::shared_ptr<LinearImpl> lora_A, lora_B;
  LoraOptions lora_options;  // the adapter's r, alpha, rslora, dropout, init (valid with lora_A)
  double lora_scaling = 0;   // lora_options.scaling(): alpha / r (alpha / sqrt(r) with rslora)
  double lora_dropout = 0;   // lora_options.dropout: on the adapter's input (training only)
  uint64_t lora_seed = 0;    // the seed add_lora drew A from (lora_init_value)

 protected:
  void rebind() override;
};
TORCH_MODULE(Linear);

class NormImpl : public LayerBase {
 public:
  NormImpl(NormKind kind, int64_t dim, double eps, const torch::TensorOptions& opts);
  // x: [..., dim] -> [..., dim]
  torch::Tensor forward(const torch::Tensor& x);
  ParamInit init_rule(const std::string& name) const override;
  NormKind kind;
  double eps;
  torch::Tensor weight, bias;  // bias only for layer_norm

 protected:
  void rebind() override;
};
TORCH_MODULE(Norm);

class EmbeddingImpl : public LayerBase {
 public:
  // padding_idx >= 0: that row gets no gradient (torch.nn.Embedding's padding_idx).
  EmbeddingImpl(int64_t num_embeddings, int64_t dim, const torch::TensorOptions& opts, int64_t padding_idx = -1);
  // ids: [...] int64 -> [..., dim]
  torch::Tensor forward(const torch::Tensor& ids);
  ParamInit init_rule(const std::string& name) const override;
  torch::Tensor weight;  // [num_embeddings, dim]
  int64_t padding_idx = -1;

 protected:
  void rebind() override;
};
TORCH_MODULE(Embedding);

// The Conv3d of the patch embedding: `proj.weight` [embed, C, T, P, P], and `proj.bias`
// [embed] when built with one (Qwen3-VL).
class PatchProjImpl : public LayerBase {
 public:
  PatchProjImpl(int64_t embed_dim, int64_t in_chans, int64_t temporal, int64_t patch,
                const torch::TensorOptions& opts, bool with_bias = false);
  ParamInit init_rule(const std::string& name) const override;
  torch::Tensor weight, bias;  // bias undefined without one

 protected:
  void rebind() override;
};
TORCH_MODULE(PatchProj);

// `visual.patch_embed`: Conv3d with kernel = stride = (T, P, P) on one patch per row, which
// equals a matmul with the weight flattened to [embed, C*T*P*P].
class PatchEmbedImpl : public torch::nn::Module {
 public:
  PatchEmbedImpl(int64_t embed_dim, int64_t in_chans, int64_t temporal, int64_t patch,
                 const torch::TensorOptions& opts, bool bias = false);
  // pixel_values: [patches, C*T*P*P] -> [patches, embed] (pixels cast to the weight dtype)
  torch::Tensor forward(const torch::Tensor& pixel_values);
  PatchProj proj{nullptr};
};
TORCH_MODULE(PatchEmbed);

}  // namespace vlm
