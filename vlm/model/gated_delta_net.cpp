#include "vlm/model/gated_delta_net.h"

#include <cmath>
#include <limits>

#include "vlm/runtime/check.h"
#include "vlm/runtime/device_staging.h"

namespace vlm {

namespace {

// The rule's arithmetic: fp32 for fp32 / bf16 / fp16 inputs (as HF's torch path and the FLA
// kernels), float64 for float64 ones (the parity tests' exact pass).
torch::ScalarType compute_dtype(const torch::Tensor& v) {
  return v.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// x * rsqrt(sum(x^2) + 1e-6) over the last dim (FLA's l2norm, as HF).
torch::Tensor l2norm(const torch::Tensor& x) { return x * torch::rsqrt((x * x).sum(-1, true) + 1e-6); }

// The rule's common preamble: value heads served by each q / k head, [B, H, L, D] fp32
// layout, L2-normalised q / k, q scaled by 1/sqrt(Dk). q, k: [B, L, Hk, Dk]; v: [B, L, Hv, Dv];
// g, beta: [B, L, Hv].
struct RuleInputs {
  torch::Tensor q, k, v, g, beta;  // [B, Hv, L, D] / [B, Hv, L]
};
RuleInputs rule_inputs(torch::Tensor q, torch::Tensor k, const torch::Tensor& v, const torch::Tensor& g,
                       const torch::Tensor& beta) {
  const int64_t hk = k.size(2), hv = v.size(2);
  VLM_CHECK(hv % hk == 0, "gated delta rule: ", hv, " value heads are not a multiple of ", hk, " key heads");
  if (hk != hv) {
    q = q.repeat_interleave(hv / hk, 2);
    k = k.repeat_interleave(hv / hk, 2);
  }
  // The same ops in the same order as HF's torch_chunk_gated_delta_rule: autograd then
  // accumulates gradients in the same order, so fp32 results agree to the last bit where the
  // kernels do (the rule's backward amplifies any rounding difference).
  const auto ct = compute_dtype(v);
  auto f32 = [ct](const torch::Tensor& x) { return x.transpose(1, 2).to(ct).contiguous(); };
  RuleInputs r;
  r.q = f32(q);
  r.k = f32(k);
  r.v = f32(v);
  r.beta = f32(beta);
  r.g = f32(g);
  r.q = l2norm(r.q);
  r.k = l2norm(r.k);
  r.q = r.q * (1.0 / std::sqrt(static_cast<double>(r.q.size(-1))));
  return r;
}

torch::Tensor zero_state(const RuleInputs& r) {
  return torch::zeros({r.v.size(0), r.v.size(1), r.k.size(-1), r.v.size(-1)}, r.v.options());
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> chunk_gated_delta_rule(const torch::Tensor& q_in, const torch::Tensor& k_in,
                                                               const torch::Tensor& v_in, const torch::Tensor& g_in,
                                                               const torch::Tensor& beta_in,
                                                               const torch::Tensor& initial_state, int64_t chunk) {
  const auto out_dtype = v_in.scalar_type();
  const int64_t length = q_in.size(1);
  RuleInputs r = rule_inputs(q_in, k_in, v_in, g_in, beta_in);
  // Pad the time axis to whole chunks (zeros: padded tokens come after every real one).
  const int64_t pad = (chunk - length % chunk) % chunk, n = (length + pad) / chunk;
  namespace F = torch::nn::functional;
  auto pad_td = [&](const torch::Tensor& x) { return F::pad(x, F::PadFuncOptions({0, 0, 0, pad})); };
  auto pad_t = [&](const torch::Tensor& x) { return F::pad(x, F::PadFuncOptions({0, pad})); };
  auto q = pad_td(r.q), k = pad_td(r.k), v = pad_td(r.v), beta = pad_t(r.beta), g = pad_t(r.g);
  auto chunks = [&](const torch::Tensor& x) {  // [B, H, n*C, D] -> [B, H, n, C, D]
    return x.reshape({x.size(0), x.size(1), n, chunk, x.size(-1)});
  };
  auto v_beta = v * beta.unsqueeze(-1);
  auto k_beta = k * beta.unsqueeze(-1);
  q = chunks(q);
  k = chunks(k);
  k_beta = chunks(k_beta);
  v_beta = chunks(v_beta);
  auto cum = g.reshape({g.size(0), g.size(1), n, chunk}).cumsum(-1);  // log decay from the chunk start
  // pair[i, j] = exp(cum_i - cum_j) for j <= i, 0 above the diagonal.
  auto upper = torch::ones({chunk, chunk}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  auto pair = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(upper, -std::numeric_limits<double>::infinity()).exp();
  auto ut = torch::matmul(k_beta, k.transpose(-1, -2)) * pair;
  auto intra = torch::matmul(q, k.transpose(-1, -2)) * pair;
  auto decayed_k_beta = k_beta * cum.exp().unsqueeze(-1);
  // UT transform: (I + strictly_lower(ut))^-1 applied to v_beta and to the decayed keys.
  auto new_values = torch::linalg_solve_triangular(ut, v_beta, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
  auto k_cumdecay =
      torch::linalg_solve_triangular(ut, decayed_k_beta, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
  torch::Tensor s = initial_state.defined() ? initial_state.to(r.v.scalar_type()) : zero_state(r);
  auto out = torch::zeros_like(new_values);  // [B, H, n, C, Dv], filled chunk by chunk
  q = q * cum.exp().unsqueeze(-1);
  k = k * (cum.narrow(-1, chunk - 1, 1) - cum).exp().unsqueeze(-1);
  auto chunk_decay = cum.select(-1, chunk - 1).exp().unsqueeze(-1).unsqueeze(-1);  // [B, H, n, 1, 1]
  for (int64_t i = 0; i < n; ++i) {  // the scan over chunks: read the state, then write it
    auto v_new = new_values.select(2, i) - torch::matmul(k_cumdecay.select(2, i), s);
    auto inter = torch::matmul(q.select(2, i), s);
    auto intra_out = torch::matmul(intra.select(2, i), v_new);
    out.select(2, i).copy_(inter + intra_out);
    auto decayed = s * chunk_decay.select(2, i);
    s = decayed + torch::matmul(k.select(2, i).transpose(-1, -2), v_new);
  }
  auto o = out.reshape({r.v.size(0), r.v.size(1), n * chunk, r.v.size(-1)}).narrow(2, 0, length);
  return {o.transpose(1, 2).contiguous().to(out_dtype), s};
}

std::pair<torch::Tensor, torch::Tensor> recurrent_gated_delta_rule(const torch::Tensor& q_in, const torch::Tensor& k_in,
                                                                   const torch::Tensor& v_in, const torch::Tensor& g_in,
                                                                   const torch::Tensor& beta_in,
                                                                   const torch::Tensor& initial_state) {
  RuleInputs r = rule_inputs(q_in, k_in, v_in, g_in, beta_in);
  torch::Tensor s = initial_state.defined() ? initial_state.to(r.v.scalar_type()) : zero_state(r);
  std::vector<torch::Tensor> outs;
  for (int64_t t = 0; t < r.q.size(2); ++t) {
    auto q = r.q.select(2, t), k = r.k.select(2, t), v = r.v.select(2, t);   // [B, H, D]
    s = s * r.g.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);               // decay
    auto kv_mem = (s * k.unsqueeze(-1)).sum(-2);                              // S^T k: [B, H, Dv]
    auto delta = (v - kv_mem) * r.beta.select(2, t).unsqueeze(-1);
    s = s + k.unsqueeze(-1) * delta.unsqueeze(-2);
    outs.push_back((s * q.unsqueeze(-1)).sum(-2));
  }
  return {torch::stack(outs, 2).transpose(1, 2).contiguous().to(v_in.scalar_type()), s};
}

std::pair<torch::Tensor, torch::Tensor> causal_conv1d_silu(const torch::Tensor& x, const torch::Tensor& weight,
                                                           const torch::Tensor& state) {
  const int64_t c = x.size(1), kk = weight.size(-1), l = x.size(2);
  VLM_CHECK(weight.dim() == 3 && weight.size(0) == c && weight.size(1) == 1, "conv1d: expected weight [", c,
            ", 1, K], got ", weight.sizes());
  auto conv = [&](const torch::Tensor& in, int64_t padding) {
    return torch::conv1d(in.to(weight.scalar_type()), weight, /*bias=*/std::nullopt, /*stride=*/{1},
                         /*padding=*/std::vector<int64_t>{padding}, /*dilation=*/{1}, /*groups=*/c);
  };
  if (!state.defined()) {  // a sequence start: zero padding in front, as HF's causal_conv1d_fn
    auto y = torch::silu(conv(x, kk - 1).narrow(-1, 0, l)).to(x.scalar_type());
    auto next = l >= kk - 1 ? x.narrow(-1, l - (kk - 1), kk - 1)
                            : torch::cat({torch::zeros({x.size(0), c, kk - 1 - l}, x.options()), x}, -1);
    return {y, next};
  }
  auto xe = torch::cat({state.to(x.scalar_type()), x}, -1);  // [B, C, K-1+L]
  auto y = torch::silu(conv(xe, 0)).to(x.scalar_type());
  return {y, xe.narrow(-1, xe.size(-1) - (kk - 1), kk - 1)};
}

// ---------------------------------------------------------------- layers

DepthwiseConv1dImpl::DepthwiseConv1dImpl(int64_t channels, int64_t kernel, const torch::TensorOptions& opts) {
  weight = register_parameter("weight", torch::empty({channels, 1, kernel}, opts));
}
ParamInit DepthwiseConv1dImpl::init_rule(const std::string&) const { return ParamInit::normal; }
void DepthwiseConv1dImpl::rebind() { weight = parameters_["weight"]; }

GatedRmsNormImpl::GatedRmsNormImpl(int64_t dim, double e, const torch::TensorOptions& opts) : eps(e) {
  weight = register_parameter("weight", torch::empty({dim}, opts));
}

torch::Tensor GatedRmsNormImpl::forward(const torch::Tensor& x, const torch::Tensor& z) {
  auto xf = x.to(torch::kFloat32);
  auto var = xf.pow(2).mean(-1, true);
  auto n = (xf * torch::rsqrt(var + eps)).to(x.scalar_type());
  auto h = weight * n;
  auto gate = torch::silu(z.to(torch::kFloat32));
  return (h * gate).to(x.scalar_type());
}
ParamInit GatedRmsNormImpl::init_rule(const std::string&) const { return ParamInit::ones; }
void GatedRmsNormImpl::rebind() { weight = parameters_["weight"]; }

GatedDeltaNetImpl::GatedDeltaNetImpl(const TextConfig& cfg, const torch::TensorOptions& opts)
    : num_k_heads(cfg.linear_num_key_heads),
      num_v_heads(cfg.linear_num_value_heads),
      head_k_dim(cfg.linear_key_head_dim),
      head_v_dim(cfg.linear_value_head_dim) {
  const int64_t d = cfg.hidden_size, key_dim = num_k_heads * head_k_dim, value_dim = num_v_heads * head_v_dim;
  const int64_t conv_dim = 2 * key_dim + value_dim;
  conv1d = register_module("conv1d", DepthwiseConv1d(conv_dim, cfg.linear_conv_kernel_dim, opts));
  dt_bias = register_parameter("dt_bias", torch::empty({num_v_heads}, opts));
  A_log = register_parameter("A_log", torch::empty({num_v_heads}, opts));
  norm = register_module("norm", GatedRmsNorm(head_v_dim, cfg.rms_norm_eps, opts));
  out_proj = register_module("out_proj", Linear(value_dim, d, false, opts));
  in_proj_qkv = register_module("in_proj_qkv", Linear(d, conv_dim, false, opts));
  in_proj_z = register_module("in_proj_z", Linear(d, value_dim, false, opts));
  in_proj_b = register_module("in_proj_b", Linear(d, num_v_heads, false, opts));
  in_proj_a = register_module("in_proj_a", Linear(d, num_v_heads, false, opts));
}

// dt_bias = 1 (as HF); A_log = 0, i.e. A = 1 (HF draws log U(0.01, 16); a checkpoint
// overwrites both).
ParamInit GatedDeltaNetImpl::init_rule(const std::string& name) const {
  return name == "dt_bias" ? ParamInit::ones : ParamInit::zeros;
}

void GatedDeltaNetImpl::rebind() {
  dt_bias = parameters_["dt_bias"];
  A_log = parameters_["A_log"];
}

GatedDeltaNetImpl::Heads GatedDeltaNetImpl::all_heads() {
  return {num_k_heads, num_v_heads, conv1d->weight, A_log, dt_bias};
}

GatedDeltaNetImpl::Heads GatedDeltaNetImpl::heads_of(int64_t r, int64_t cp, std::vector<int64_t>* channels) {
  const std::string problem = ulysses_heads_problem(num_v_heads, num_k_heads, cp, "value heads", "key heads");
  VLM_CHECK(problem.empty(), "sequence parallelism over a Gated DeltaNet layer: value and key heads: ", problem,
            " (hint: pick a dist.cp that divides the linear-attention value heads)");
  const int64_t hv = num_v_heads / cp, key_dim = num_k_heads * head_k_dim, c = 2 * key_dim + num_v_heads * head_v_dim;
  const int64_t hk = num_k_heads >= cp ? num_k_heads / cp : 1;
  const int64_t k0 = num_k_heads >= cp ? r * hk : r * num_k_heads / cp;  // first key head
  const int64_t v0 = r * hv;                                             // first value head
  std::vector<int64_t> ch;
  for (int64_t part : {int64_t{0}, key_dim})  // q, then k channels of the key heads
    for (int64_t i = k0 * head_k_dim; i < (k0 + hk) * head_k_dim; ++i) ch.push_back(part + i);
  for (int64_t i = v0 * head_v_dim; i < (v0 + hv) * head_v_dim; ++i) ch.push_back(2 * key_dim + i);
  const int64_t conv_channels = static_cast<int64_t>(ch.size());
  for (int64_t part : {c, c + num_v_heads})  // b, a of the value heads
    for (int64_t i = v0; i < v0 + hv; ++i) ch.push_back(part + i);
  auto idx = stage_to_device(torch::tensor(std::vector<int64_t>(ch.begin(), ch.begin() + conv_channels), torch::kInt64),
                             conv1d->weight.device());
  if (channels != nullptr) *channels = std::move(ch);
  return {hk, hv, conv1d->weight.index_select(0, idx), A_log.narrow(0, v0, hv), dt_bias.narrow(0, v0, hv)};
}

torch::Tensor GatedDeltaNetImpl::mix(const torch::Tensor& qkv, const torch::Tensor& b, const torch::Tensor& a,
                                     LinearAttentionState* state, const Heads& heads) {
  const int64_t bs = qkv.size(0), l = qkv.size(1), key_dim = heads.hk * head_k_dim;
  auto [y, conv_state] = causal_conv1d_silu(qkv.transpose(1, 2), heads.conv_weight,
                                            state != nullptr ? state->conv : torch::Tensor());
  y = y.transpose(1, 2);  // [B, l, C_h]
  auto q = y.narrow(-1, 0, key_dim).reshape({bs, l, heads.hk, head_k_dim});
  auto k = y.narrow(-1, key_dim, key_dim).reshape({bs, l, heads.hk, head_k_dim});
  auto v = y.narrow(-1, 2 * key_dim, heads.hv * head_v_dim).reshape({bs, l, heads.hv, head_v_dim});
  auto beta = b.sigmoid();                                                                  // [B, l, hv]
  auto g = -heads.A_log.to(torch::kFloat32).exp() * torch::softplus(a.to(torch::kFloat32) + heads.dt_bias);  // log decay
  const torch::Tensor init = state != nullptr ? state->recurrent : torch::Tensor();
  auto [o, final_state] = (init.defined() && l == 1) ? recurrent_gated_delta_rule(q, k, v, g, beta, init)
                                                     : chunk_gated_delta_rule(q, k, v, g, beta, init);
  if (state != nullptr) *state = {conv_state, final_state};
  return o;
}

torch::Tensor GatedDeltaNetImpl::mix_row(const torch::Tensor& qkv, const torch::Tensor& b, const torch::Tensor& a,
                                         LinearAttentionState* state, const std::vector<int64_t>* cu,
                                         const Heads& heads) {
  if (cu == nullptr) return mix(qkv, b, a, state, heads);
  std::vector<torch::Tensor> parts;  // every packed sample starts from a zero conv and recurrent state
  for (size_t i = 0; i + 1 < cu->size(); ++i) {
    const int64_t s = (*cu)[i], n = (*cu)[i + 1] - s;
    if (n > 0) parts.push_back(mix(qkv.narrow(1, s, n), b.narrow(1, s, n), a.narrow(1, s, n), nullptr, heads));
  }
  return torch::cat(parts, 1);
}

torch::Tensor GatedDeltaNetImpl::forward(const torch::Tensor& x, const torch::Tensor& mask,
                                         LinearAttentionState* state, const std::vector<int64_t>* cu,
                                         SequenceExchange* sp) {
  const int64_t b = x.size(0), l = x.size(1);
  const int64_t lf = sp != nullptr ? l * sp->size() : l;  // the whole sequence
  VLM_CHECK(sp == nullptr || state == nullptr, "sequence parallelism: no decoding state (training forwards only)");
  VLM_CHECK(cu == nullptr || (b == 1 && state == nullptr),
            "packed linear attention (text cu_seqlens) needs one row [1, L] and no decoding state; got B = ", b);
  VLM_CHECK(cu == nullptr || (cu->size() >= 2 && cu->front() == 0 && cu->back() == lf),
            "text cu_seqlens must run from 0 to ", lf, " (the packed length)");
  // HF's order of ops (see rule_inputs): projections, then the conv, then the decays.
  const auto h = (mask.defined() && l > 1) ? x * mask.unsqueeze(-1).to(x.scalar_type()) : x;
  auto qkv = in_proj_qkv(h);                                              // [B, L, C]
  auto z = in_proj_z(h).reshape({b, l, num_v_heads, head_v_dim});
  auto pb = in_proj_b(h);                                                 // [B, L, Hv]
  auto pa = in_proj_a(h);                                                 // [B, L, Hv]
  torch::Tensor o;  // [B, L, Hv, Dv]
  if (sp == nullptr) {
    o = mix_row(qkv, pb, pa, state, cu, all_heads());
  } else {  // by heads (either mode): rank j gets the channels of its heads ([q, k, v, b, a]) of this rank's tokens
    const int64_t cp = sp->size();
    std::vector<int64_t> idx;
    for (int64_t j = 0; j < cp; ++j) {
      std::vector<int64_t> ch;
      heads_of(j, cp, &ch);
      idx.insert(idx.end(), ch.begin(), ch.end());
    }
    std::vector<int64_t> mine;
    const Heads heads = heads_of(sp->rank(), cp, &mine);
    const int64_t w = static_cast<int64_t>(mine.size()), ch = w - 2 * heads.hv;
    auto all = torch::cat({qkv, pb, pa}, -1);  // [B, Ls, C + 2 Hv]
    auto send = all.index_select(-1, stage_to_device(torch::tensor(idx, torch::kInt64), all.device()))
                    .view({b, l, cp, w}).permute({2, 0, 1, 3}).contiguous();  // [cp, B, Ls, w]
    auto got = sp->all_to_all(send, "sequence parallel linear attention inputs");  // chunk j: rank j's tokens
    auto full = rank_order_to_sequence(got.permute({1, 0, 2, 3}).reshape({b, lf, w}), 1, cp, sp->mode());  // [B, L, w]
    auto parts = full.split_with_sizes({ch, heads.hv, heads.hv}, -1);
    o = mix_row(parts[0], parts[1], parts[2], nullptr, cu, heads);              // [B, L, hv, Dv]
    o = sequence_to_rank_order(o, 1, cp, sp->mode());
    o = heads_to_seq(*sp, o.transpose(1, 2), "sequence parallel linear attention output");  // [B, Ls, Hv, Dv]
  }
  o = norm(o.reshape({-1, head_v_dim}), z.reshape({-1, head_v_dim})).reshape({b, l, num_v_heads * head_v_dim});
  return out_proj(o);
}

}  // namespace vlm
