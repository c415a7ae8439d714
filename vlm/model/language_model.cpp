#include "vlm/model/language_model.h"

#include <memory>

#include "vlm/runtime/check.h"
#include "vlm/model/rotary.h"
#include "vlm/model/row_scatter.h"
#include "vlm/runtime/device_staging.h"

namespace vlm {

torch::Tensor causal_padding_mask(const torch::Tensor& attention_mask, int64_t l) {
  const int64_t t = attention_mask.size(1), past = t - l;
  auto dev = attention_mask.device();
  auto qpos = torch::arange(past, t, torch::TensorOptions().dtype(torch::kInt64).device(dev)).unsqueeze(1);  // [L,1]
  auto kpos = torch::arange(0, t, torch::TensorOptions().dtype(torch::kInt64).device(dev)).unsqueeze(0);     // [1,T]
  auto causal = kpos <= qpos;                                   // [L, T]
  auto real = attention_mask.to(torch::kBool).unsqueeze(1);     // [B, 1, T]
  auto mask = causal.unsqueeze(0).logical_and(real);            // [B, L, T]
  mask = mask.logical_or((kpos == qpos).unsqueeze(0));          // a query always sees itself
  return mask.unsqueeze(1);                                     // [B, 1, L, T]
}

LanguageModelImpl::LanguageModelImpl(const TextConfig& c, const torch::TensorOptions& opts) : cfg(c) {
  embed_tokens = register_module("embed_tokens", Embedding(cfg.vocab_size, cfg.hidden_size, opts, cfg.pad_token_id));
  layers_list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    layers.push_back(DecoderLayer(cfg, i, opts));
    layers_list->push_back(layers.back());
  }
  norm = register_module("norm", Norm(cfg.norm, cfg.hidden_size, cfg.rms_norm_eps, opts));
}

torch::Tensor LanguageModelImpl::embed(const torch::Tensor& input_ids, UnitRunner& runner,
                                       const std::string& prefix) {
  return runner.run(prefix + ".embed_tokens", *embed_tokens, input_ids,
                    [emb = embed_tokens](const torch::Tensor& ids) mutable { return emb(ids); });
}

torch::Tensor LanguageModelImpl::forward(const torch::Tensor& embeds, const torch::Tensor& position_ids,
                                         const torch::Tensor& attention_mask, KvCache* cache,
                                         UnitRunner& runner, const std::string& prefix,
                                         const DeepStackInputs* deepstack,
                                         const std::vector<int64_t>* text_cu_seqlens,
                                         const std::shared_ptr<RouterAuxState>& aux, SequenceExchange* sp) {
  const int64_t b = embeds.size(0), l = embeds.size(1);
  // Attention sees the whole sequence: lf tokens (l on a sequence-parallel rank's chunk).
  const int64_t lf = sp != nullptr ? l * sp->size() : l;
  const bool ring = sp != nullptr && sp->mode() == SequenceMode::kRing;
  VLM_CHECK(sp == nullptr || (cache == nullptr && aux == nullptr),
            "sequence parallelism: no KV cache and no load-balancing loss (training forwards of dense models)");
  VLM_CHECK(text_cu_seqlens == nullptr || (b == 1 && !attention_mask.defined() && cache == nullptr),
            "text_cu_seqlens: a packed row is [1, L] with no attention_mask and no cache, got B = ", b);
  const int64_t past = cache ? cache->length() : 0;
  VLM_CHECK(position_ids.dim() == 3 && position_ids.size(0) == 3 && position_ids.size(1) == b &&
                position_ids.size(2) == l,
            "position_ids: expected [3, ", b, ", ", l, "], got ", position_ids.sizes());
  VLM_CHECK(attention_mask.defined() || cache == nullptr,
            "attention_mask: decoding with a KV cache needs the mask of the cached + new tokens");
  VLM_CHECK(!attention_mask.defined() || (attention_mask.dim() == 2 && attention_mask.size(0) == b &&
                                          attention_mask.size(1) == past + lf),
            "attention_mask: expected [", b, ", ", past + lf, "] (cached + new tokens), got ",
            attention_mask.defined() ? attention_mask.sizes() : torch::IntArrayRef{});
  if (cache && cache->layers.empty()) cache->layers.resize(layers.size());
  auto cs = mrope_cos_sin(stage_to_device(position_ids, embeds.device()), cfg.rotary_dim(), cfg.rope_theta,
                          cfg.mrope_section, embeds.scalar_type(), cfg.mrope_interleaved);  // [B, L, R]
  // Undefined: causal attention without a mask tensor (flash attention on CUDA). Ring
  // attention takes the key padding [B, L] itself and builds each block's mask from positions.
  torch::Tensor mask;
  if (attention_mask.defined()) {
    mask = stage_to_device(attention_mask, embeds.device());
    mask = ring ? mask.to(torch::kBool) : causal_padding_mask(mask, lf);
  }
  // The new tokens' padding, for linear-attention layers (zeroed before the mixer); under
  // sequence parallelism this rank's tokens of it.
  torch::Tensor padding;
  if (attention_mask.defined() && cfg.count_layers(MixerKind::linear_attention) > 0) {
    padding = sp == nullptr ? attention_mask.narrow(1, past, l)
                            : gather_layout(attention_mask, 1, sequence_layout(lf, sp->size(), sp->rank(), sp->mode()));
    padding = stage_to_device(padding, embeds.device());
  }
  // Owned copy: activation checkpointing reruns the layer in backward, after the caller's
  // vector is gone.
  std::shared_ptr<const std::vector<int64_t>> cu;
  if (text_cu_seqlens != nullptr) cu = std::make_shared<const std::vector<int64_t>>(*text_cu_seqlens);
  auto h = embeds;
  for (size_t i = 0; i < layers.size(); ++i) {
    DecoderLayer& layer = layers[i];
    LayerCache* kv = cache ? &cache->layers[i] : nullptr;
    h = runner.run(prefix + ".layers." + std::to_string(i), *layer, h,
                   [layer, cos = cs.cos, sin = cs.sin, mask, padding, kv, cu, aux, sp](const torch::Tensor& x) mutable {
                     return layer(x, cos, sin, mask, padding, kv, cu.get(), aux.get(), sp);
                   });
    if (deepstack != nullptr && i < deepstack->embeds.size()) {
      // h[mask] += embeds[i], as HF's _deepstack_process. By index when the rows are known:
      // masked_scatter's backward (masked_select) has a data-dependent shape, a host sync.
      const auto e = deepstack->embeds[i].to(h.scalar_type());
      if (deepstack->dense) {
        h = h + e;
      } else if (deepstack->rows.defined()) {
        h = add_rows(h.reshape({-1, h.size(-1)}), deepstack->rows, e).view_as(h);
      } else {
        auto m = stage_to_device(deepstack->mask, h.device()).unsqueeze(-1).expand_as(h);
        h = h + torch::zeros_like(h).masked_scatter(m, e);
      }
    }
  }
  if (cache) cache->tokens = past + l;
  return runner.run(prefix + ".norm", *norm, h, [n = norm](const torch::Tensor& x) mutable { return n(x); });
}

}  // namespace vlm
