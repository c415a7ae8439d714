#include "vlm/model/moe.h"

#include <optional>
#include <string>

#include "vlm/runtime/check.h"
#include "vlm/runtime/device_staging.h"

namespace vlm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y -> y in forward; in backward, p (a layer's masked router-probability sum, [E] fp32)
// receives `grad` ([E] fp32, RouterAuxState::grad: filled in place once the forward has seen
// every sparse layer, so it is read at backward time, not when the node is built).
struct RouterAuxGrad : public torch::autograd::Function<RouterAuxGrad> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& y, const torch::Tensor& p,
                               const torch::Tensor& grad) {
    ctx->saved_data["grad"] = grad;
    ctx->saved_data["p_dtype"] = static_cast<int64_t>(p.scalar_type());
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto g = ctx->saved_data["grad"].toTensor();
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["p_dtype"].toInt());
    return {grad_out[0], g.to(dtype), torch::Tensor()};
  }
};

// Whether compute() may use at::_grouped_mm: bf16 on CUDA, fp32 on the CPU (its reference
// implementation), with 16-byte aligned rows and columns.
bool grouped_mm_eligible(const torch::Tensor& rows, const torch::Tensor& gate_up) {
  const auto dt = rows.scalar_type();
  const bool ok_dtype = rows.is_cuda() ? dt == torch::kBFloat16 : dt == torch::kFloat32;
  const int64_t per16 = 16 / static_cast<int64_t>(c10::elementSize(dt));
  return ok_dtype && gate_up.scalar_type() == dt && rows.size(1) % per16 == 0 && gate_up.size(1) % (2 * per16) == 0;
}

}  // namespace

torch::Tensor RouterAuxState::finish(int64_t num_experts) {
  recording = false;
  VLM_CHECK(!counts.empty(), "RouterAuxState::finish: no sparse layer recorded its routing");
  auto c = counts[0], p = prob_sums[0];
  for (size_t i = 1; i < counts.size(); ++i) {
    c = c + counts[i];
    p = p + prob_sums[i];
  }
  const auto r = rows * static_cast<double>(counts.size());  // R: real tokens x sparse layers
  const auto f = c / r;                                        // [E] assignments per row
  const double e = static_cast<double>(num_experts);
  // d aux / d p_le = E f_e / R, the same for every layer.
  grad.copy_(f * (aux_weight * e) / r);
  return (f * (p / r)).sum() * e;
}

// ---------------------------------------------------------------- experts

MoeExpertsImpl::MoeExpertsImpl(int64_t e, int64_t dim, int64_t inter, const torch::TensorOptions& opts)
    : num_experts(e) {
  gate_up_proj = register_parameter("gate_up_proj", torch::empty({e, 2 * inter, dim}, opts));
  down_proj = register_parameter("down_proj", torch::empty({e, dim, inter}, opts));
}

ParamInit MoeExpertsImpl::init_rule(const std::string&) const { return ParamInit::normal; }

void MoeExpertsImpl::rebind() {
  gate_up_proj = parameters_["gate_up_proj"];
  down_proj = parameters_["down_proj"];
}

void MoeExpertsImpl::keep_experts(int64_t first, int64_t count) {
  VLM_CHECK(first >= 0 && count >= 1 && first + count <= num_experts, "keep_experts: experts [", first, ", ",
            first + count, ") outside the layer's ", num_experts);
  VLM_CHECK(first_expert == 0 && held() == num_experts, "keep_experts: the experts were already split (held ",
            held(), " from ", first_expert, ")");
  torch::NoGradGuard no_grad;
  for (const char* name : {"gate_up_proj", "down_proj"}) {
    torch::Tensor* slot = parameters_.find(name);
    const bool rg = slot->requires_grad();
    // A copy, not a view: the rank keeps only its experts' memory.
    auto kept = slot->is_meta() ? torch::empty({count, slot->size(1), slot->size(2)}, slot->options())
                                : slot->narrow(0, first, count).clone();
    kept.set_requires_grad(rg);
    *slot = kept;
  }
  first_expert = first;
  rebind();
}

torch::Tensor MoeExpertsImpl::compute(const torch::Tensor& rows, const torch::Tensor& counts) {
  VLM_CHECK(counts.dim() == 1 && counts.size(0) == held(), "MoeExperts::compute: counts has ", counts.sizes(),
            ", expected [", held(), "] (one per held expert)");
  const int64_t inter = down_proj.size(2);
  if (grouped_mm_eligible(rows, gate_up_proj)) {
    // One grouped GEMM per projection over every held expert; offsets stay on the device.
    const auto offs = stage_to_device(counts, rows.device()).cumsum(0).to(torch::kInt32);
    const auto gu = at::_grouped_mm(rows, gate_up_proj.transpose(-2, -1), offs);  // [M, 2I]
    const auto a = (torch::silu(gu.narrow(-1, 0, inter)) * gu.narrow(-1, inter, inter)).contiguous();
    return at::_grouped_mm(a, down_proj.transpose(-2, -1), offs);  // [M, d]
  }
  // One GEMM pair per non-empty expert (the counts are read on the host: free on CPU). The
  // weights are unbound once: one backward node stacks the experts' gradients, where indexing
  // gate_up_proj[e] per expert would make each expert's backward a zero-filled [E, 2I, d].
  const auto host = counts.to(torch::kCPU, torch::kInt64);
  const auto* c = host.data_ptr<int64_t>();
  const auto w_gate_up = gate_up_proj.unbind(0), w_down = down_proj.unbind(0);
  std::vector<torch::Tensor> outs;
  int64_t offset = 0;
  for (int64_t e = 0; e < held(); ++e) {
    if (c[e] == 0) continue;
    const auto x = rows.narrow(0, offset, c[e]);
    const auto gu = torch::linear(x, w_gate_up[static_cast<size_t>(e)]);  // [c, 2I]
    const auto a = torch::silu(gu.narrow(-1, 0, inter)) * gu.narrow(-1, inter, inter);
    outs.push_back(torch::linear(a, w_down[static_cast<size_t>(e)]));  // [c, d]
    offset += c[e];
  }
  VLM_CHECK(offset == rows.size(0), "MoeExperts::compute: counts sum to ", offset, ", expected the ", rows.size(0),
            " rows");
  if (outs.empty()) return rows.narrow(0, 0, 0);  // no rows: no expert ran
  return outs.size() == 1 ? outs[0] : torch::cat(outs, 0);
}

torch::Tensor MoeExpertsImpl::forward(const torch::Tensor& x, const torch::Tensor& experts,
                                      const torch::Tensor& weights) {
  const int64_t k = experts.size(1);
  const auto flat = experts.reshape({-1});                                   // [M]
  const auto order = std::get<1>(flat.sort(std::optional<bool>(true), /*dim=*/0, false));  // [M] rows by expert
  const auto token = order.div(k, "floor");                                  // [M] their tokens
  // Rows per expert, on the device (scatter_add: no host sync, unlike bincount).
  const auto counts = torch::zeros({num_experts}, flat.options()).scatter_add_(0, flat, torch::ones_like(flat));
  const auto rows = x.index_select(0, token);  // [M, d]
  torch::Tensor out;
  if (dispatcher) {
    out = dispatcher->dispatch(*this, rows, counts);
  } else {
    VLM_CHECK(held() == num_experts, "MoeExperts: this module holds experts [", first_expert, ", ",
              first_expert + held(), ") of ", num_experts, " but has no dispatcher (hint: expert parallelism "
              "installs one)");
    out = compute(rows, counts);
  }
  out = out * weights.reshape({-1}).index_select(0, order).unsqueeze(1);
  return torch::zeros_like(x).index_add(0, token, out.to(x.scalar_type()));
}

// ---------------------------------------------------------------- block

SparseMoeBlockImpl::SparseMoeBlockImpl(const TextConfig& cfg, const torch::TensorOptions& opts)
    : top_k(cfg.num_experts_per_tok) {
  gate = register_module("gate", Linear(cfg.hidden_size, cfg.num_experts, /*bias=*/false, opts));
  experts = register_module(
      "experts", MoeExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, opts));
  if (cfg.shared_expert_intermediate_size > 0) {
    shared_expert = register_module("shared_expert", Mlp(MlpKind::gated_silu, cfg.hidden_size,
                                                         cfg.shared_expert_intermediate_size, false, opts));
    shared_expert_gate = register_module("shared_expert_gate", Linear(cfg.hidden_size, 1, false, opts));
  }
}

torch::Tensor SparseMoeBlockImpl::forward(const torch::Tensor& x, RouterAuxState* aux) {
  const auto h = x.reshape({-1, x.size(-1)});                          // [N, d]
  const auto logits = gate(h);                                         // [N, E] model dtype
  const auto probs = torch::softmax(logits, -1, torch::kFloat32);      // [N, E] fp32
  auto [top_w, top_i] = probs.topk(top_k, -1);                         // [N, k]
  top_w = top_w / top_w.sum(-1, /*keepdim=*/true);
  auto out = experts(h, top_i, top_w.to(logits.scalar_type()));      // [N, d]
  if (shared_expert) out = out + torch::sigmoid(shared_expert_gate(h)) * shared_expert(h);
  if (aux != nullptr) {
    const auto& tw = aux->token_weight;
    const auto p = (tw.defined() ? probs * tw.unsqueeze(1) : probs).sum(0);  // [E]
    if (aux->recording) {
      const auto ones = tw.defined() ? tw : torch::ones({h.size(0)}, probs.options());
      aux->counts.push_back(torch::zeros_like(p).scatter_add_(0, top_i.reshape({-1}),
                                                              ones.repeat_interleave(top_k)));
      aux->prob_sums.push_back(p.detach());
    }
    out = RouterAuxGrad::apply(out, p, aux->grad);
  }
  return out.view_as(x);
}

}  // namespace vlm
