#include "vlm/model/merger.h"

#include "vlm/runtime/check.h"

namespace vlm {

MergerMlpImpl::MergerMlpImpl(int64_t in, int64_t out, const torch::TensorOptions& opts) {
  fc0 = register_module("0", Linear(in, in, true, opts));
  fc2 = register_module("2", Linear(in, out, true, opts));
}

torch::Tensor MergerMlpImpl::forward(const torch::Tensor& x) {
  return fc2(torch::gelu(fc0(x)));  // exact (erf) GELU
}

PatchMergerImpl::PatchMergerImpl(const VlmConfig& cfg, const torch::TensorOptions& opts) {
  const auto& v = cfg.vision;
  merged_dim = v.embed_dim * v.merge_unit();
  ln_q = register_module("ln_q", Norm(v.norm, v.embed_dim, v.norm_eps, opts));
  mlp = register_module("mlp", MergerMlp(merged_dim, v.out_hidden_size, opts));
}

torch::Tensor PatchMergerImpl::forward(const torch::Tensor& x) {
  const int64_t unit = merged_dim / x.size(1);
  VLM_CHECK(x.dim() == 2 && x.size(0) % unit == 0, "merger input: expected [S, ", x.size(1),
            "] with S divisible by ", unit, ", got ", x.sizes());
  return mlp(ln_q(x).reshape({-1, merged_dim}));
}

}  // namespace vlm
