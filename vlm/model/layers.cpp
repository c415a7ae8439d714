#include "vlm/model/layers.h"

#include "vlm/runtime/check.h"

namespace vlm {

void LayerBase::replace_parameter(const std::string& name, torch::Tensor value) {
  torch::Tensor* slot = parameters_.find(name);
  VLM_ASSERT(slot != nullptr, "no parameter '", name, "'");
  VLM_ASSERT(slot->sizes() == value.sizes(), "shape change for '", name, "'");
  value.set_requires_grad(slot->requires_grad());
  *slot = std::move(value);
  rebind();
}

// ---------------------------------------------------------------- Linear

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias,
                       const torch::TensorOptions& opts) {
  weight = register_parameter("weight", torch::empty({out_features, in_features}, opts));
  if (with_bias) bias = register_parameter("bias", torch::empty({out_features}, opts));
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = bias.defined() ? torch::linear(x, weight, bias) : torch::linear(x, weight);
  if (!lora_A) return y;
  return y + lora_delta(x).to(y.scalar_type());
}

torch::Tensor LinearImpl::lora_delta(const torch::Tensor& x) {
  torch::Tensor h = lora_dropout > 0 ? torch::dropout(x, lora_dropout, is_training()) : x;
  h = torch::linear(torch::linear(h.to(lora_A->weight.scalar_type()), lora_A->weight), lora_B->weight);
  return h * lora_scaling;
}

ParamInit LinearImpl::init_rule(const std::string& name) const {
  return name == "bias" ? ParamInit::zeros : ParamInit::normal;
}

void LinearImpl::rebind() {
  weight = parameters_["weight"];
  if (parameters_.contains("bias")) bias = parameters_["bias"];
}

// ---------------------------------------------------------------- Norm

NormImpl::NormImpl(NormKind k, int64_t dim, double e, const torch::TensorOptions& opts)
    : kind(k), eps(e) {
  weight = register_parameter("weight", torch::empty({dim}, opts));
  if (kind == NormKind::layer_norm) bias = register_parameter("bias", torch::empty({dim}, opts));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  if (kind == NormKind::layer_norm) {
    return torch::layer_norm(x, {weight.size(0)}, weight, bias, eps);
  }
  auto xf = x.to(torch::kFloat32);
  auto var = xf.pow(2).mean(-1, /*keepdim=*/true);
  if (kind == NormKind::rms_norm_centered) {  // (x * w).to(dtype), not x.to(dtype) * w (as HF)
    auto normed = xf * torch::rsqrt(var + eps);
    auto scale = 1.0 + weight.to(torch::kFloat32);
    return (normed * scale).to(x.scalar_type());
  }
  return weight * (xf * torch::rsqrt(var + eps)).to(x.scalar_type());
}

ParamInit NormImpl::init_rule(const std::string& name) const {
  if (name == "bias" || kind == NormKind::rms_norm_centered) return ParamInit::zeros;
  return ParamInit::ones;
}

void NormImpl::rebind() {
  weight = parameters_["weight"];
  if (parameters_.contains("bias")) bias = parameters_["bias"];
}

// ---------------------------------------------------------------- Embedding

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t dim, const torch::TensorOptions& opts,
                             int64_t pad)
    : padding_idx(pad) {
  VLM_CHECK(pad < num_embeddings, "embedding: padding_idx ", pad, " is outside the ", num_embeddings, " rows");
  weight = register_parameter("weight", torch::empty({num_embeddings, dim}, opts));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  return torch::embedding(weight, ids, padding_idx);
}

ParamInit EmbeddingImpl::init_rule(const std::string&) const { return ParamInit::normal; }

void EmbeddingImpl::rebind() { weight = parameters_["weight"]; }

// ---------------------------------------------------------------- PatchEmbed

PatchProjImpl::PatchProjImpl(int64_t embed_dim, int64_t in_chans, int64_t temporal, int64_t patch,
                             const torch::TensorOptions& opts, bool with_bias) {
  weight = register_parameter("weight",
                              torch::empty({embed_dim, in_chans, temporal, patch, patch}, opts));
  if (with_bias) bias = register_parameter("bias", torch::empty({embed_dim}, opts));
}

ParamInit PatchProjImpl::init_rule(const std::string& name) const {
  return name == "bias" ? ParamInit::zeros : ParamInit::normal;
}

void PatchProjImpl::rebind() {
  weight = parameters_["weight"];
  if (parameters_.contains("bias")) bias = parameters_["bias"];
}

PatchEmbedImpl::PatchEmbedImpl(int64_t embed_dim, int64_t in_chans, int64_t temporal, int64_t patch,
                               const torch::TensorOptions& opts, bool bias) {
  proj = register_module("proj", PatchProj(embed_dim, in_chans, temporal, patch, opts, bias));
}

torch::Tensor PatchEmbedImpl::forward(const torch::Tensor& pixel_values) {
  const auto& w = proj->weight;
  const int64_t patch_dim = w.numel() / w.size(0);
  VLM_CHECK(pixel_values.dim() == 2 && pixel_values.size(1) == patch_dim,
            "pixel_values: expected [patches, ", patch_dim, "], got ", pixel_values.sizes(),
            " (hint: rows are C*T*P*P patches in merge-block order)");
  const auto x = pixel_values.to(w.scalar_type());
  const auto w2 = w.reshape({w.size(0), patch_dim}).t();
  return proj->bias.defined() ? torch::addmm(proj->bias, x, w2) : torch::matmul(x, w2);
}

}  // namespace vlm
