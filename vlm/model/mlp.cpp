#include "vlm/model/mlp.h"

namespace vlm {

MlpImpl::MlpImpl(MlpKind k, int64_t dim, int64_t hidden, bool bias, const torch::TensorOptions& opts)
    : kind(k) {
  if (kind == MlpKind::quick_gelu) {
    fc1 = register_module("fc1", Linear(dim, hidden, bias, opts));
    fc2 = register_module("fc2", Linear(hidden, dim, bias, opts));
  } else if (kind == MlpKind::gelu_tanh) {
    fc1 = register_module("linear_fc1", Linear(dim, hidden, bias, opts));
    fc2 = register_module("linear_fc2", Linear(hidden, dim, bias, opts));
  } else {
    gate_proj = register_module("gate_proj", Linear(dim, hidden, bias, opts));
    up_proj = register_module("up_proj", Linear(dim, hidden, bias, opts));
    down_proj = register_module("down_proj", Linear(hidden, dim, bias, opts));
  }
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) { return out_proj().forward(hidden(x)); }

torch::Tensor MlpImpl::hidden(const torch::Tensor& x) {
  if (kind == MlpKind::quick_gelu) {
    auto h = fc1(x);
    return h * torch::sigmoid(1.702 * h);
  }
  if (kind == MlpKind::gelu_tanh) return torch::gelu(fc1(x), "tanh");
  return torch::silu(gate_proj(x)) * up_proj(x);
}

LinearImpl& MlpImpl::out_proj() { return kind == MlpKind::gated_silu ? *down_proj : *fc2; }

}  // namespace vlm
