#include "vlm/model/language_model.h"

#include <algorithm>
#include <memory>

#include "vlm/runtime/check.h"
#include "vlm/model/rotary.h"
#include "vlm/model/row_scatter.h"
#include "vlm/runtime/device_staging.h"
#include "vlm/model/tensor_parallel.h"

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
  // Tensor parallelism: this rank's vocabulary rows and the layers' local heads / widths.
  const TextConfig local = tensor_parallel_local(cfg);
  const int64_t tp = std::max<int64_t>(1, cfg.tensor_parallel);
  embed_tokens = register_module("embed_tokens", Embedding(cfg.vocab_size / tp, cfg.hidden_size, opts,
                                                           tp > 1 ? -1 : cfg.pad_token_id));
  layers_list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    layers.push_back(DecoderLayer(local, i, opts));
    layers_list->push_back(layers.back());
  }
  norm = register_module("norm", Norm(cfg.norm, cfg.hidden_size, cfg.rms_norm_eps, opts));
}

void LanguageModelImpl::set_layer_range(int64_t first, int64_t end, bool norm) {
  const int64_t n = static_cast<int64_t>(layers.size());
  VLM_CHECK(first >= 0 && (end < 0 || (first < end && end <= n)), "set_layer_range: [", first, ", ", end,
            ") is not a run of the ", n, " decoder layers");
  first_layer_ = first;
  end_layer_ = end;
  final_norm_ = norm;
}

torch::Tensor LanguageModelImpl::embed(const torch::Tensor& input_ids, UnitRunner& runner,
                                       const std::string& prefix, SequenceExchange* tp) {
  if (tp != nullptr && tp->size() > 1) {
    VLM_CHECK(tp->size() == cfg.tensor_parallel, "tensor parallelism: the model was built for tp = ",
              cfg.tensor_parallel, " but the exchange has ", tp->size(), " ranks");
    return runner.run(prefix + ".embed_tokens", *embed_tokens, input_ids,
                      [emb = embed_tokens, tp, pad = cfg.pad_token_id](const torch::Tensor& ids) mutable {
                        return vocab_parallel_embedding(*tp, emb->weight, ids, pad, "tensor parallel: embeddings");
                      });
  }
  return runner.run(prefix + ".embed_tokens", *embed_tokens, input_ids,
                    [emb = embed_tokens](const torch::Tensor& ids) mutable { return emb(ids); });
}

torch::Tensor LanguageModelImpl::forward(const torch::Tensor& embeds, const torch::Tensor& position_ids,
                                         const torch::Tensor& attention_mask, KvCache* cache,
                                         UnitRunner& runner, const std::string& prefix,
                                         const DeepStackInputs* deepstack,
                                         const std::vector<int64_t>* text_cu_seqlens,
                                         const std::shared_ptr<RouterAuxState>& aux, SequenceExchange* sp,
                                         SequenceExchange* tp) {
  if (tp != nullptr && tp->size() == 1) tp = nullptr;
  VLM_CHECK(tp == nullptr || (sp == nullptr && aux == nullptr),
            "tensor parallelism: not with context parallelism or a load-balancing loss yet");
  if (tp != nullptr && cache == nullptr)
    return forward_tp_sequence(embeds, position_ids, attention_mask, runner, prefix, deepstack, text_cu_seqlens, *tp);
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
  for (size_t i = static_cast<size_t>(first_layer_); i < static_cast<size_t>(end_layer()); ++i) {
    DecoderLayer& layer = layers[i];
    LayerCache* kv = cache ? &cache->layers[i] : nullptr;
    h = runner.run(prefix + ".layers." + std::to_string(i), *layer, h,
                   [layer, cos = cs.cos, sin = cs.sin, mask, padding, kv, cu, aux, sp, tp](const torch::Tensor& x) mutable {
                     return layer(x, cos, sin, mask, padding, kv, cu.get(), aux.get(), sp, tp, /*tp_sequence=*/false);
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
  if (!final_norm_) return h;
  return runner.run(prefix + ".norm", *norm, h, [n = norm](const torch::Tensor& x) mutable { return n(x); });
}

torch::Tensor LanguageModelImpl::forward_tp_sequence(torch::Tensor embeds, torch::Tensor pos, torch::Tensor attention_mask,
                                                     UnitRunner& runner, const std::string& prefix,
                                                     const DeepStackInputs* deepstack,
                                                     const std::vector<int64_t>* text_cu_seqlens, SequenceExchange& tp) {
  // A pipeline stage after the first receives its sequence chunk [B, L / tp, d] (what the
  // previous stage's layers left on this tp rank); the whole length comes from the positions.
  const bool chunk_in = first_layer_ > 0;
  const int64_t b = embeds.size(0), l = chunk_in ? pos.size(2) : embeds.size(1), d = embeds.size(2);
  VLM_CHECK(pos.dim() == 3 && pos.size(0) == 3 && pos.size(1) == b && pos.size(2) == l,
            "position_ids: expected [3, ", b, ", ", l, "], got ", pos.sizes());
  VLM_CHECK(!attention_mask.defined() || (attention_mask.dim() == 2 && attention_mask.size(0) == b &&
                                          attention_mask.size(1) == l),
            "attention_mask: expected [", b, ", ", l, "], got ",
            attention_mask.defined() ? attention_mask.sizes() : torch::IntArrayRef{});
  const auto dev = embeds.device();
  const SequenceChunk chunk = sequence_chunk(l, tp.size(), tp.rank());
  const int64_t pad = chunk.padded - l;
  // Padding to a multiple of tp: after every real token (causal attention never reaches it),
  // masked as a key, its own packed segment, the last position repeated.
  pos = stage_to_device(pos, dev);
  if (attention_mask.defined()) attention_mask = stage_to_device(attention_mask, dev);
  auto cu = text_cu_seqlens != nullptr ? std::make_shared<std::vector<int64_t>>(*text_cu_seqlens) : nullptr;
  VLM_CHECK(!chunk_in || embeds.size(1) == chunk.len, "tensor parallel: a pipeline stage expects its sequence chunk [",
            b, ", ", chunk.len, ", ", d, "], got ", embeds.sizes());
  if (pad > 0) {
    if (!chunk_in) embeds = torch::cat({embeds, torch::zeros({b, pad, d}, embeds.options())}, 1);
    pos = torch::cat({pos, pos.narrow(2, l - 1, 1).expand({3, b, pad})}, 2);
    if (attention_mask.defined())
      attention_mask = torch::cat({attention_mask, torch::zeros({b, pad}, attention_mask.options())}, 1);
    if (cu) cu->push_back(chunk.padded);
  }
  auto cs = mrope_cos_sin(pos, cfg.rotary_dim(), cfg.rope_theta, cfg.mrope_section, embeds.scalar_type(),
                          cfg.mrope_interleaved);  // [B, L, R]: every token (the mixers see all)
  torch::Tensor mask, padding;
  if (attention_mask.defined()) {
    mask = causal_padding_mask(attention_mask, chunk.padded);
    if (cfg.count_layers(MixerKind::linear_attention) > 0) padding = attention_mask;
  }
  // DeepStack features as this rank's dense addends: zero but at its image tokens.
  std::vector<torch::Tensor> ds;
  if (deepstack != nullptr)
    for (const auto& e : deepstack->embeds) {
      torch::Tensor full;
      if (deepstack->rows.defined()) {  // flat rows b*L+t -> b*padded+t
        auto rows = deepstack->rows + deepstack->rows.div(l, "floor") * pad;
        full = add_rows(torch::zeros({b * chunk.padded, d}, e.options()), rows, e).view({b, chunk.padded, d});
      } else {
        auto m = stage_to_device(deepstack->mask, dev).to(torch::kBool);
        if (pad > 0) m = torch::cat({m, torch::zeros({b, pad}, m.options())}, 1);
        full = torch::zeros({b, chunk.padded, d}, e.options()).masked_scatter(m.unsqueeze(-1).expand({b, chunk.padded, d}), e);
      }
      ds.push_back(full.narrow(1, chunk.begin, chunk.len).contiguous());
    }
  // This rank's chunk (a copy: the whole embeddings are not kept alive through a view). Its
  // backward leaves the other chunks' gradient to their ranks (tensor_parallel.h).
  auto h = chunk_in ? embeds : embeds.narrow(1, chunk.begin, chunk.len).clone();  // [B, L / tp, d]
  SequenceExchange* tpp = &tp;
  for (size_t i = static_cast<size_t>(first_layer_); i < static_cast<size_t>(end_layer()); ++i) {
    DecoderLayer& layer = layers[i];
    h = runner.run(prefix + ".layers." + std::to_string(i), *layer, h,
                   [layer, cos = cs.cos, sin = cs.sin, mask, padding, cu, tpp](const torch::Tensor& x) mutable {
                     return layer(x, cos, sin, mask, padding, nullptr, cu.get(), nullptr, nullptr, tpp, true);
                   });
    if (i < ds.size()) h = h + ds[i].to(h.scalar_type());
  }
  if (!final_norm_) return h;  // a pipeline stage before the last: its chunk goes to the next stage
  h = runner.run(prefix + ".norm", *norm, h, [n = norm](const torch::Tensor& x) mutable { return n(x); });
  return tp_all_gather(tp, h, 1, "tensor parallel: the final hidden states").narrow(1, 0, l);
}

}  // namespace vlm
