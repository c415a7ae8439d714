// Chunked linear + cross-entropy (see chunked_cross_entropy.h).
#include "vlm/model/chunked_cross_entropy.h"

#include <algorithm>

#include "vlm/runtime/check.h"
#include "vlm/runtime/device_staging.h"

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

  // Recomputes each chunk's logits with autograd on, takes the gradient of the loss with
  // respect to the logits in the parameters' dtype ([m, V], as autograd would give the head's
  // matmul), and applies the matmul's backward itself: hidden's rows get g @ W, and W's
  // gradient accumulates g^T @ h straight into one [V, d] fp32 buffer (float64 for float64
  // weights). On CUDA the bf16 / fp16 GEMM writes fp32 with cuBLAS' fp32 accumulation
  // (addmm's out_dtype), so no chunk materialises a [V, d] gradient in the parameters' dtype
  // nor converts one (0.93 GB and ~3 GB of traffic per chunk at V = 151,936, d = 3,584);
  // fp32 / float64 weights accumulate in place (addmm_). Only bf16 / fp16 on the CPU keep a
  // per-chunk temporary. A frozen head (LoRA, a frozen LLM) gets no weight gradient at all.
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
    const auto w = weight.detach();
    for (int64_t r = 0; r < n; r += chunk) {
      const int64_t m = std::min(chunk, n - r);
      const auto h = hidden.narrow(0, r, m).detach();
      torch::Tensor g;  // [m, V] in the parameters' dtype: d loss / d (h @ W^T)
      {
        torch::AutoGradMode grad_on(true);
        auto logits = torch::matmul(h, w.t()).requires_grad_(true);  // [m, V]
        auto loss = torch::nn::functional::cross_entropy(
            logits.to(torch::kFloat32), labels.narrow(0, r, m),
            torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
        g = torch::autograd::grad({loss}, {logits}, {grad_out[0]})[0];
      }
      torch::Tensor gh = grad_hidden.narrow(0, r, m);  // a contiguous row block: written in place
      torch::mm_out(gh, g, w);                         // [m, d]
      if (want_weight) accumulate_weight_grad(grad_weight, g, h);
    }
    if (!want_weight) return {grad_hidden, torch::Tensor(), torch::Tensor(), torch::Tensor()};
    return {grad_hidden, grad_weight.to(weight.scalar_type()), torch::Tensor(), torch::Tensor()};
  }

 private:
  // acc [V, d] (fp32 / float64) += g^T [V, m] @ h [m, d] (the parameters' dtype).
  static void accumulate_weight_grad(torch::Tensor& acc, const torch::Tensor& g, const torch::Tensor& h) {
    if (g.scalar_type() == acc.scalar_type()) {
      acc.addmm_(g.t(), h);
    } else if (acc.is_cuda()) {
      at::addmm_out(acc, acc, g.t(), h, acc.scalar_type());
    } else {
      acc.add_(torch::mm(g.t(), h).to(acc.scalar_type()));
    }
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
  return ChunkedLinearCrossEntropy::apply(hidden, weight, stage_to_device(labels, hidden.device(), torch::kInt64), chunk);
}

}  // namespace vlm
