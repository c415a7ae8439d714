// Feed-forward blocks: Qwen2-VL's ViT MLP (`fc1`, QuickGELU, `fc2`), Qwen3-VL's ViT MLP
// (`linear_fc1`, tanh GELU, `linear_fc2`) and the gated SiLU MLP
// (`gate_proj`, `up_proj`, `down_proj`) of Qwen2.5-VL's ViT (with biases) and of the LLM
// (without biases).
#pragma once
#include <torch/torch.h>

#include "vlm/model/layer_kinds.h"
#include "vlm/model/layers.h"

namespace vlm {

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(MlpKind kind, int64_t dim, int64_t hidden, bool bias, const torch::TensorOptions& opts);
  // x: [..., dim] -> [..., dim]; = out_proj()(hidden(x))
  torch::Tensor forward(const torch::Tensor& x);
  // The input of the last Linear: x: [..., dim] -> [..., hidden]
  torch::Tensor hidden(const torch::Tensor& x);
  // The last Linear (fc2 / linear_fc2 / down_proj).
  LinearImpl& out_proj();
  MlpKind kind;
  Linear fc1{nullptr}, fc2{nullptr};  // quick_gelu ("fc1", "fc2"), gelu_tanh ("linear_fc1", "linear_fc2")
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};  // gated_silu
};
TORCH_MODULE(Mlp);

}  // namespace vlm
