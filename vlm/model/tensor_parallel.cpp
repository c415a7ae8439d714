#include "vlm/model/tensor_parallel.h"

#include <algorithm>
#include <regex>

#include "vlm/model/chunked_cross_entropy.h"
#include "vlm/runtime/check.h"

namespace vlm {

// ---------------------------------------------------------------- collectives

torch::Tensor tp_all_gather(SequenceExchange& ex, const torch::Tensor& x, int64_t dim, const std::string& what) {
  if (ex.size() == 1) return x;
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  if (d == 0) return ex.all_gather(x, what);
  return ex.all_gather(x.movedim(d, 0), what).movedim(0, d);
}

torch::Tensor tp_reduce_scatter(SequenceExchange& ex, const torch::Tensor& x, int64_t dim, const std::string& what) {
  if (ex.size() == 1) return x;
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  VLM_ASSERT(x.size(d) % ex.size() == 0, what, ": dim ", d, " of ", x.sizes(), " does not divide by tp = ", ex.size());
  if (d == 0) return ex.reduce_scatter(x, what);
  return ex.reduce_scatter(x.movedim(d, 0), what).movedim(0, d);
}

torch::Tensor tp_all_reduce(SequenceExchange& ex, const torch::Tensor& x, const std::string& what) {
  if (ex.size() == 1) return x;
  return ex.all_reduce(x, what);
}

// ---------------------------------------------------------------- parameter splits

TpSplit tensor_parallel_split(const VlmConfig& cfg, const std::string& name, int64_t tp) {
  const TextConfig& t = cfg.text;
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return {0, {t.vocab_size}, tp};
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(name, m, layer)) return {};
  const int64_t index = std::stoll(m[1].str());
  const std::string rest = m[2].str();
  const int64_t hd = t.head_dim(), h = t.num_attention_heads, hkv = t.num_key_value_heads;
  if (rest == "self_attn.q_proj.weight" || rest == "self_attn.q_proj.bias")
    return {0, {h * hd * (t.attn_output_gate ? 2 : 1)}, tp};
  if (rest == "self_attn.k_proj.weight" || rest == "self_attn.k_proj.bias" || rest == "self_attn.v_proj.weight" ||
      rest == "self_attn.v_proj.bias")
    return {0, {hkv * hd}, std::min(hkv, tp)};
  if (rest == "self_attn.o_proj.weight") return {1, {h * hd}, tp};
  if (!t.sparse_layer(index)) {
    if (rest == "mlp.gate_proj.weight" || rest == "mlp.up_proj.weight") return {0, {t.intermediate_size}, tp};
    if (rest == "mlp.down_proj.weight") return {1, {t.intermediate_size}, tp};
  }
  const int64_t key = t.linear_num_key_heads * t.linear_key_head_dim;
  const int64_t value = t.linear_num_value_heads * t.linear_value_head_dim;
  if (rest == "linear_attn.in_proj_qkv.weight" || rest == "linear_attn.conv1d.weight" ||
      rest == "linear_attn.conv1d.bias")
    return {0, {key, key, value}, tp};
  if (rest == "linear_attn.in_proj_z.weight") return {0, {value}, tp};
  if (rest == "linear_attn.in_proj_b.weight" || rest == "linear_attn.in_proj_a.weight" ||
      rest == "linear_attn.A_log" || rest == "linear_attn.dt_bias")
    return {0, {t.linear_num_value_heads}, tp};
  if (rest == "linear_attn.out_proj.weight") return {1, {value}, tp};
  return {};
}

torch::Tensor tp_slice(const torch::Tensor& full, const TpSplit& split, int64_t rank, int64_t tp) {
  if (!split.split() || tp == 1) return full.clone();
  int64_t total = 0;
  for (int64_t b : split.blocks) total += b;
  VLM_CHECK(full.size(split.dim) == total, "tensor parallel slice: dim ", split.dim, " of ", full.sizes(),
            " is not the blocks' ", total);
  std::vector<torch::Tensor> parts;
  int64_t off = 0;
  const int64_t n = split.parts, i = split.piece(rank, tp);
  for (int64_t b : split.blocks) {
    VLM_CHECK(b % n == 0, "tensor parallel slice: a block of ", b, " does not divide into ", n, " pieces");
    parts.push_back(full.narrow(split.dim, off + i * (b / n), b / n));
    off += b;
  }
  return torch::cat(parts, split.dim).contiguous();
}

torch::Tensor tp_unslice(const std::vector<torch::Tensor>& slices, const TpSplit& split) {
  VLM_CHECK(!slices.empty(), "tensor parallel unslice: no slices");
  if (!split.split() || slices.size() == 1) return slices.front().clone();
  const int64_t tp = static_cast<int64_t>(slices.size()), n = split.parts;
  VLM_CHECK(tp % n == 0, "tensor parallel unslice: ", tp, " slices for ", n, " pieces");
  std::vector<torch::Tensor> parts;
  int64_t off = 0;  // within each rank's slice
  for (int64_t b : split.blocks) {
    for (int64_t j = 0; j < n; ++j) parts.push_back(slices[static_cast<size_t>(j * tp / n)].narrow(split.dim, off, b / n));
    off += b / n;
  }
  return torch::cat(parts, split.dim);
}

std::string tensor_parallel_problem(const TextConfig& t, int64_t tp) {
  if (tp <= 1) return "";
  auto divides = [&](int64_t n, const std::string& what) -> std::string {
    return n % tp == 0 ? "" : str(n, " ", what, " do not divide by tp = ", tp);
  };
  std::vector<std::string> out;
  if (t.count_layers(MixerKind::full_attention) > 0) {
    out.push_back(divides(t.num_attention_heads, "attention heads"));
    if (t.num_key_value_heads % tp != 0 && tp % t.num_key_value_heads != 0)
      out.push_back(str(t.num_key_value_heads, " key/value heads neither divide by nor divide tp = ", tp));
  }
  if (t.count_layers(MixerKind::linear_attention) > 0) {
    out.push_back(divides(t.linear_num_key_heads, "Gated DeltaNet key heads"));
    out.push_back(divides(t.linear_num_value_heads, "Gated DeltaNet value heads"));
  }
  if (t.count_sparse_layers() < t.num_hidden_layers) out.push_back(divides(t.intermediate_size, "MLP channels"));
  out.push_back(divides(t.vocab_size, "vocabulary rows"));
  std::string msg;
  for (const auto& s : out)
    if (!s.empty()) msg += (msg.empty() ? "" : "; ") + s;
  return msg;
}

TextConfig tensor_parallel_local(const TextConfig& cfg) {
  const int64_t tp = cfg.tensor_parallel;
  TextConfig l = cfg;
  if (tp <= 1) return l;
  const std::string problem = tensor_parallel_problem(cfg, tp);
  VLM_CHECK(problem.empty(), "tensor parallelism: ", problem, " (hint: pick a dist.tp that divides them)");
  l.explicit_head_dim = cfg.head_dim();
  l.num_attention_heads = cfg.num_attention_heads / tp;
  l.num_key_value_heads = std::max<int64_t>(1, cfg.num_key_value_heads / tp);  // fewer: one, replicated
  l.intermediate_size = cfg.intermediate_size / tp;
  l.linear_num_key_heads = cfg.linear_num_key_heads / tp;
  l.linear_num_value_heads = cfg.linear_num_value_heads / tp;
  return l;
}

// ---------------------------------------------------------------- vocabulary parallel

torch::Tensor vocab_parallel_embedding(SequenceExchange& ex, const torch::Tensor& weight, const torch::Tensor& ids,
                                       int64_t padding_idx, const std::string& what) {
  const int64_t vt = weight.size(0), off = ex.rank() * vt;
  auto local = ids - off;
  auto held = local.ge(0).logical_and(local.lt(vt));  // [...]
  const int64_t pad = padding_idx >= off && padding_idx < off + vt ? padding_idx - off : -1;
  auto e = torch::embedding(weight, local.clamp(0, vt - 1), pad);            // [..., d]
  e = e * held.unsqueeze(-1).to(e.scalar_type());
  return tp_all_reduce(ex, e, what);
}

namespace {

// The loss over the vocabulary slices (tensor_parallel.h). Saved: hidden, weight, labels,
// each row's log-sum-exp over the whole vocabulary (fp32).
class VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& labels, int64_t ex_address,
                               int64_t chunk_rows) {
    auto& ex = *reinterpret_cast<SequenceExchange*>(ex_address);
    const int64_t n = hidden.size(0), vt = weight.size(0), tp = ex.size(), off = ex.rank() * vt;
    auto lse = torch::zeros({n}, hidden.options().dtype(torch::kFloat32));
    auto total = torch::zeros({}, lse.options());
    for (int64_t a = 0; a < n; a += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, n - a);
      auto logits = torch::matmul(hidden.narrow(0, a, rows), weight.t()).to(torch::kFloat32);  // [rows, Vt]
      auto lab = labels.narrow(0, a, rows) - off;
      auto held = lab.ge(0).logical_and(lab.lt(vt));
      auto mine = std::get<0>(logits.max(1));                                                  // [rows]
      auto maxima = ex.all_to_all(mine.unsqueeze(0).expand({tp, rows}), "vocab parallel loss: row maxima");
      auto mx = std::get<0>(maxima.max(0));                                                    // [rows]
      auto target = logits.gather(1, lab.clamp(0, vt - 1).unsqueeze(1)).squeeze(1) * held.to(torch::kFloat32);
      auto parts = torch::stack({(logits - mx.unsqueeze(1)).exp().sum(1), target}, 0);         // [2, rows]
      std::vector<int64_t> shape{tp, 2, rows};
      auto sums = ex.all_to_all(parts.unsqueeze(0).expand(shape), "vocab parallel loss: sums").sum(0);
      auto row_lse = sums[0].log() + mx;
      lse.narrow(0, a, rows).copy_(row_lse);
      auto valid = labels.narrow(0, a, rows).ne(-100);
      total += torch::where(valid, row_lse - sums[1], torch::zeros_like(row_lse)).sum();
    }
    ctx->save_for_backward({hidden, weight, labels, lse});
    ctx->saved_data["off"] = off;
    ctx->saved_data["chunk"] = chunk_rows;
    return total;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &labels = saved[2], &lse = saved[3];
    const int64_t off = ctx->saved_data["off"].toInt(), chunk = ctx->saved_data["chunk"].toInt();
    const int64_t n = hidden.size(0), vt = weight.size(0);
    const auto g = grads[0].to(torch::kFloat32);
    auto dh = torch::empty_like(hidden);
    auto dw = torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat32));
    for (int64_t a = 0; a < n; a += chunk) {
      const int64_t rows = std::min(chunk, n - a);
      auto h = hidden.narrow(0, a, rows);
      auto logits = torch::matmul(h, weight.t()).to(torch::kFloat32);
      auto p = (logits - lse.narrow(0, a, rows).unsqueeze(1)).exp();  // softmax over the whole vocabulary
      auto lab = labels.narrow(0, a, rows) - off;
      auto held = lab.ge(0).logical_and(lab.lt(vt));
      p.scatter_add_(1, lab.clamp(0, vt - 1).unsqueeze(1), -held.to(torch::kFloat32).unsqueeze(1));
      p = p * (labels.narrow(0, a, rows).ne(-100).to(torch::kFloat32) * g).unsqueeze(1);
      dh.narrow(0, a, rows).copy_(torch::matmul(p.to(hidden.scalar_type()), weight));
      dw.add_(torch::matmul(p.t(), h.to(torch::kFloat32)));
    }
    return {dh, dw.to(weight.scalar_type()), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocab_parallel_cross_entropy(SequenceExchange& ex, const torch::Tensor& hidden,
                                           const torch::Tensor& weight, const torch::Tensor& labels,
                                           int64_t chunk_rows) {
  VLM_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) && labels.dim() == 1 &&
                labels.size(0) == hidden.size(0),
            "vocab parallel loss: hidden [N, d], weight [Vt, d], labels [N], got ", hidden.sizes(), ", ",
            weight.sizes(), ", ", labels.sizes());
  if (chunk_rows <= 0) chunk_rows = cross_entropy_chunk_rows(weight.size(0));
  chunk_rows = std::max<int64_t>(1, chunk_rows);
  return VocabParallelCrossEntropy::apply(hidden, weight, labels, reinterpret_cast<int64_t>(&ex), chunk_rows);
}

}  // namespace vlm
