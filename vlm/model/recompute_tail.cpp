// Recompute tails (see recompute_tail.h).
#include "vlm/model/recompute_tail.h"

#include <atomic>

namespace vlm {

namespace {

thread_local const torch::nn::Module* t_tail_unit = nullptr;
std::atomic<int64_t> g_skipped{0};

// y = h + m W^T + b for autograd, h for the value: inputs (h, m, W, b); without a bias b is
// an empty placeholder (autograd functions take no undefined inputs).
struct ResidualLinearTail : public torch::autograd::Function<ResidualLinearTail> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& h,
                               const torch::Tensor& m, const torch::Tensor& w, const torch::Tensor& b) {
    ctx->save_for_backward({m, w});
    ctx->saved_data["has_bias"] = b.numel() > 0;
    return h;  // autograd returns it as a view of h carrying this node
  }

  // g: [..., out] -> dh [..., out], dm [..., in], dW [out, in], db [out]
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& m = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor& g = grads[0];
    torch::Tensor dh, dm, dw, db;
    if (!g.defined()) return {dh, dm, dw, db};
    const torch::Tensor gy = g.to(w.scalar_type());
    if (ctx->needs_input_grad(0)) dh = g;
    if (ctx->needs_input_grad(1)) dm = gy.matmul(w);
    const int64_t out = w.size(0), in = w.size(1);
    if (ctx->needs_input_grad(2)) dw = gy.reshape({-1, out}).t().mm(m.reshape({-1, in}));
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(3))
      db = gy.reshape({-1, out}).sum(0);
    return {dh, dm, dw, db};
  }
};

}  // namespace

RecomputeTail::RecomputeTail(const torch::nn::Module* unit) : previous_(t_tail_unit) { t_tail_unit = unit; }

RecomputeTail::~RecomputeTail() { t_tail_unit = previous_; }

torch::Tensor residual_linear(const torch::nn::Module* block, const torch::Tensor& h,
                              const torch::Tensor& m, LinearImpl& out_proj) {
  if (block == nullptr || block != t_tail_unit || !torch::GradMode::is_enabled())
    return h + out_proj.forward(m);
  ++g_skipped;
  const torch::Tensor b = out_proj.bias.defined() ? out_proj.bias : torch::empty({0}, h.options());
  torch::Tensor y = ResidualLinearTail::apply(h, m, out_proj.weight, b);
  if (out_proj.lora_A) y = y + out_proj.lora_delta(m).to(m.scalar_type());
  return y;
}

int64_t recompute_tails_skipped() { return g_skipped.load(); }

}  // namespace vlm
