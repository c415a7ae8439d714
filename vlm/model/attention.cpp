#include "vlm/model/attention.h"

#include <algorithm>
#include <cmath>

#include "vlm/runtime/check.h"
#include "vlm/model/ring_attention.h"
#include "vlm/model/vision_split.h"
#include "vlm/model/rotary.h"
#include "vlm/runtime/device_staging.h"

namespace vlm {

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& mask, double scale, bool causal) {
  const int64_t h = q.size(1), hkv = k.size(1);
  VLM_ASSERT(h % hkv == 0, "heads ", h, " not a multiple of kv heads ", hkv);
  VLM_ASSERT(!(causal && mask.defined()), "attention: give a mask or causal, not both");
  VLM_ASSERT(!causal || q.size(2) == k.size(2), "attention: causal needs as many keys as queries (no cache)");
  // Bool mask: true = attend. enable_gqa lets the kernel read kv head j / (H / Hkv) for
  // query head j without materialising repeated keys and values. Without a mask the flash /
  // memory-efficient kernels are eligible on CUDA.
  return at::scaled_dot_product_attention(
      q, k, v, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt, /*dropout_p=*/0.0,
      causal, scale, /*enable_gqa=*/h != hkv);
}

namespace {

// One flash-attention varlen call over the whole packed sequence (CUDA, bf16/fp16): the
// kernel reads the segment boundaries itself, GQA included; causal for the LLM's packed
// samples, not for the vision tower's images / windows. q: [S, H, D], k/v: [S, Hkv, D] -> [S, H, D]
torch::Tensor flash_varlen(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const std::vector<int64_t>& cu, double scale, bool causal) {
  int64_t max_len = 0;
  for (size_t i = 0; i + 1 < cu.size(); ++i) max_len = std::max(max_len, cu[i + 1] - cu[i]);
  std::vector<int32_t> cu32(cu.begin(), cu.end());
  auto cu_dev = stage_to_device(torch::tensor(cu32, torch::kInt32), q.device());
  auto out = at::_flash_attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), cu_dev, cu_dev,
                                          max_len, max_len, /*dropout_p=*/0.0, causal,
                                          /*return_debug_mask=*/false, scale);
  return std::get<0>(out);
}

bool flash_varlen_applies(const torch::Tensor& q) {
  const auto dt = q.scalar_type();
  return q.is_cuda() && (dt == torch::kBFloat16 || dt == torch::kHalf) && q.size(2) % 8 == 0 && q.size(2) <= 256;
}

}  // namespace

torch::Tensor varlen_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const std::vector<int64_t>& cu, double scale, bool causal) {
  const int64_t s = q.size(0);
  VLM_CHECK(cu.size() >= 2 && cu.front() == 0 && cu.back() == s, "cu_seqlens must run from 0 to ",
            s, " (the packed length), got ", cu.size(), " entries ending at ", cu.empty() ? -1 : cu.back());
  if (flash_varlen_applies(q)) return flash_varlen(q, k, v, cu, scale, causal);  // LLM (causal) and vision
  std::vector<torch::Tensor> outs;
  size_t i = 0;
  while (i + 1 < cu.size()) {
    const int64_t len = cu[i + 1] - cu[i];
    VLM_CHECK(len >= 0, "cu_seqlens must not decrease (entry ", i + 1, ")");
    size_t j = i + 1;  // group [i, j) of consecutive segments with the same length
    while (j + 1 < cu.size() && cu[j + 1] - cu[j] == len) ++j;
    const int64_t n = static_cast<int64_t>(j - i);
    if (len > 0) {
      auto take = [&](const torch::Tensor& x) {  // [n*len, H, D] -> [n, H, len, D]
        return x.narrow(0, cu[i], n * len).reshape({n, len, x.size(1), x.size(2)}).transpose(1, 2);
      };
      auto o = attention(take(q), take(k), take(v), torch::Tensor(), scale, causal);  // [n, H, len, D]
      outs.push_back(o.transpose(1, 2).reshape({n * len, q.size(1), q.size(2)}));
    }
    i = j;
  }
  return torch::cat(outs, 0);
}

// ---------------------------------------------------------------- vision

VisionAttentionImpl::VisionAttentionImpl(int64_t dim, int64_t heads, const torch::TensorOptions& opts)
    : num_heads(heads) {
  qkv = register_module("qkv", Linear(dim, 3 * dim, true, opts));
  proj = register_module("proj", Linear(dim, dim, true, opts));
}

torch::Tensor VisionAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                           const torch::Tensor& sin, const std::vector<int64_t>& cu,
                                           SequenceExchange* sp) {
  const int64_t s = x.size(0), dim = x.size(1), d = dim / num_heads;
  auto parts = qkv(x).reshape({s, 3, num_heads, d}).unbind(1);  // 3 x [S, H, D]
  const auto dt = x.scalar_type();
  auto c = cos.unsqueeze(1), sn = sin.unsqueeze(1);              // [S, 1, D] fp32
  auto q = apply_rotary(parts[0].to(torch::kFloat32), c, sn).to(dt);
  auto k = apply_rotary(parts[1].to(torch::kFloat32), c, sn).to(dt);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto o = sp != nullptr ? vision_attention_split(*sp, q, k, parts[2], cu, scale)  // [S, H, D]
                         : varlen_attention(q, k, parts[2], cu, scale);
  return proj(o.reshape({s, dim}));
}

// ---------------------------------------------------------------- text

TextAttentionImpl::TextAttentionImpl(const TextConfig& cfg, const torch::TensorOptions& opts)
    : num_heads(cfg.num_attention_heads),
      num_kv_heads(cfg.num_key_value_heads),
      head_dim(cfg.head_dim()),
      output_gate(cfg.attn_output_gate) {
  const int64_t d = cfg.hidden_size;
  const bool b = cfg.attention_bias;
  q_proj = register_module("q_proj", Linear(d, num_heads * head_dim * (output_gate ? 2 : 1), b, opts));
  k_proj = register_module("k_proj", Linear(d, num_kv_heads * head_dim, b, opts));
  v_proj = register_module("v_proj", Linear(d, num_kv_heads * head_dim, b, opts));
  o_proj = register_module("o_proj", Linear(num_heads * head_dim, d, false, opts));
  if (cfg.qk_norm) {
    q_norm = register_module("q_norm", Norm(cfg.norm, head_dim, cfg.rms_norm_eps, opts));
    k_norm = register_module("k_norm", Norm(cfg.norm, head_dim, cfg.rms_norm_eps, opts));
  }
}

torch::Tensor TextAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                         const torch::Tensor& sin, const torch::Tensor& mask,
                                         LayerKv* cache, const std::vector<int64_t>* cu_seqlens,
                                         SequenceExchange* sp) {
  const int64_t b = x.size(0), l = x.size(1);
  VLM_CHECK(sp == nullptr || cache == nullptr, "sequence parallelism: no KV cache (training forwards only)");
  VLM_CHECK(cu_seqlens == nullptr || (b == 1 && !mask.defined() && cache == nullptr),
            "packed attention (text cu_seqlens) needs one row [1, L], no mask and no KV cache; got B = ", b,
            mask.defined() ? ", a mask" : "", cache != nullptr ? ", a cache" : "",
            " (hint: a packed batch is for training forwards only)");
  auto q = q_proj(x);
  torch::Tensor gate;  // [B, L, H * D]
  if (output_gate) {   // per head [query | gate]
    auto qg = q.view({b, l, num_heads, 2, head_dim});
    gate = qg.select(3, 1).reshape({b, l, num_heads * head_dim});
    q = qg.select(3, 0);
  }
  q = q.reshape({b, l, num_heads, head_dim});  // [B, L, H, D]
  // HF's order: q_proj, q_norm, k_proj, k_norm, v_proj.
  if (q_norm) q = q_norm(q);
  auto k = k_proj(x).view({b, l, num_kv_heads, head_dim});  // [B, L, Hkv, D]
  if (k_norm) k = k_norm(k);
  q = q.transpose(1, 2);  // [B, H, L, D]
  k = k.transpose(1, 2);  // [B, Hkv, L, D]
  auto v = v_proj(x).view({b, l, num_kv_heads, head_dim}).transpose(1, 2);
  auto c = cos.unsqueeze(1), sn = sin.unsqueeze(1);                         // [B, 1, L, R]
  q = apply_partial_rotary(q, c, sn);
  k = apply_partial_rotary(k, c, sn);
  if (cache != nullptr) {
    if (cache->k.defined()) {
      k = torch::cat({cache->k, k}, 2);
      v = torch::cat({cache->v, v}, 2);
    }
    cache->k = k;
    cache->v = v;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (sp != nullptr && sp->mode() == SequenceMode::kRing) {  // this rank's queries, k/v around the ring
    auto o = ring_attention(*sp, q, k, v, mask, cu_seqlens, scale, "ring attention");  // [B, H, Ls, D]
    return out(o.transpose(1, 2).reshape({b, l, num_heads * head_dim}), gate);
  }
  if (sp != nullptr) {  // Ulysses: every token, H / cp heads; then back to this rank's tokens
    auto hs = seq_to_heads(*sp, q, k, v, "sequence parallel q/k/v");  // [B, H / cp, L_full, D]
    const int64_t lf = hs.q.size(2), hc = hs.q.size(1);
    torch::Tensor o;
    if (cu_seqlens != nullptr) {
      auto packed = [](const torch::Tensor& t) { return t.squeeze(0).transpose(0, 1); };
      o = varlen_attention(packed(hs.q), packed(hs.k), packed(hs.v), *cu_seqlens, scale, /*causal=*/true)
              .transpose(0, 1).unsqueeze(0);  // [1, H / cp, L_full, D]
    } else {
      o = attention(hs.q, hs.k, hs.v, mask, scale, !mask.defined());
    }
    VLM_ASSERT(o.size(1) == hc && o.size(2) == lf, "sequence parallel attention output ", o.sizes());
    auto mine = heads_to_seq(*sp, o, "sequence parallel attention output");  // [B, Ls, H, D]
    return out(mine.reshape({b, l, num_heads * head_dim}), gate);
  }
  if (cu_seqlens != nullptr) {  // packed row: causal inside each sample, [1, H, L, D] <-> [L, H, D]
    auto packed = [](const torch::Tensor& t) { return t.squeeze(0).transpose(0, 1); };
    auto o = varlen_attention(packed(q), packed(k), packed(v), *cu_seqlens, scale, /*causal=*/true);
    return out(o.reshape({1, l, num_heads * head_dim}), gate);
  }
  // No mask: causal attention of right-padded rows (training; see LanguageModelImpl).
  auto o = attention(q, k, v, mask, scale, !mask.defined());
  return out(o.transpose(1, 2).reshape({b, l, num_heads * head_dim}), gate);
}

torch::Tensor TextAttentionImpl::out(const torch::Tensor& o, const torch::Tensor& gate) {
  return o_proj(gate.defined() ? o * torch::sigmoid(gate) : o);
}

}  // namespace vlm
