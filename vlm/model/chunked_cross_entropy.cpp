// Chunked linear + cross-entropy (see chunked_cross_entropy.h).
#include "vlm/model/chunked_cross_entropy.h"

#include <algorithm>

#include "vlm/runtime/check.h"

namespace vlm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One chunk's summed cross-entropy exactly as HF computes it: the matmul in the inputs'
// dtype, logits upcast to fp32, torch's cross_entropy (so a single chunk is bit-identical
// to the unchunked computation, and so are its gradients).
// h: [m, d], w: [V, d], lb: [m] -> fp32 scalar
torch::Tensor chunk_loss(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& lb) {
  auto logits = torch::matmul(h, w.t()).to(torch::kFloat32);  // [m, V]
  return torch::nn::functional::cross_entropy(
      logits, lb, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
}

class ChunkedLinearCrossEntropy : public torch::autograd::Function<ChunkedLinearCrossEntropy> {
 public:
  // hidden [N, d], weight [V, d], labels [N] -> fp32 scalar
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& labels, int64_t chunk) {
    const int64_t n = hidden.size(0);
    auto total = torch::zeros({}, hidden.options().dtype(torch::kFloat32));
    for (int64_t r = 0; r < n; r += chunk) {
      const int64_t m = std::min(chunk, n - r);
      total += chunk_loss(hidden.narrow(0, r, m), weight, labels.narrow(0, r, m));
    }
    ctx->save_for_backward({hidden, weight, labels});
    ctx->saved_data["chunk"] = chunk;
    return total;
  }

  // Recomputes each chunk with autograd on (one chunk of logits alive at a time) and
  // accumulates the weight gradient in fp32 (float64 for float64 weights). A frozen head
  // (LoRA, a frozen LLM) gets none: neither the [V, d] accumulator nor its matmul.
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto& hidden = saved[0];
    const auto& weight = saved[1];
    const auto& labels = saved[2];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t n = hidden.size(0);
    const bool want_weight = ctx->needs_input_grad(1);
    const auto acc = weight.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    auto grad_hidden = torch::empty_like(hidden);
    torch::Tensor grad_weight;
    if (want_weight) grad_weight = torch::zeros(weight.sizes(), weight.options().dtype(acc));
    torch::AutoGradMode grad_on(true);
    auto w = weight.detach().requires_grad_(want_weight);
    for (int64_t r = 0; r < n; r += chunk) {
      const int64_t m = std::min(chunk, n - r);
      auto h = hidden.narrow(0, r, m).detach().requires_grad_(true);
      auto loss = chunk_loss(h, w, labels.narrow(0, r, m));
      if (!want_weight) {
        grad_hidden.narrow(0, r, m).copy_(torch::autograd::grad({loss}, {h}, {grad_out[0]})[0]);
        continue;
      }
      auto g = torch::autograd::grad({loss}, {h, w}, {grad_out[0]});
      grad_hidden.narrow(0, r, m).copy_(g[0]);
      grad_weight.add_(g[1].to(acc));
    }
    if (!want_weight) return {grad_hidden, torch::Tensor(), torch::Tensor(), torch::Tensor()};
    return {grad_hidden, grad_weight.to(weight.scalar_type()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t cross_entropy_chunk_rows(int64_t vocab, int64_t budget_bytes) {
  VLM_CHECK(vocab > 0, "cross-entropy: vocabulary size must be > 0, got ", vocab);
  return std::max<int64_t>(1, budget_bytes / (vocab * 4));
}

torch::Tensor chunked_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                           const torch::Tensor& labels, int64_t chunk_rows) {
  VLM_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
            "cross-entropy: expected hidden [N, d] and weight [V, d], got ", hidden.sizes(), " and ",
            weight.sizes());
  VLM_CHECK(labels.dim() == 1 && labels.size(0) == hidden.size(0), "cross-entropy: labels must be [",
            hidden.size(0), "], got ", labels.sizes());
  const int64_t chunk = chunk_rows > 0 ? chunk_rows : cross_entropy_chunk_rows(weight.size(0));
  if (hidden.size(0) == 0) return (hidden.sum() * 0).to(torch::kFloat32) + (weight.sum() * 0).to(torch::kFloat32);
  return ChunkedLinearCrossEntropy::apply(hidden, weight, labels.to(hidden.device(), torch::kInt64), chunk);
}

}  // namespace vlm
