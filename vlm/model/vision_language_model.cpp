#include "vlm/model/vision_language_model.h"

#include "vlm/runtime/check.h"
#include "vlm/model/chunked_cross_entropy.h"
#include "vlm/families/registry.h"
#include "vlm/model/rope_index.h"
#include "vlm/model/row_scatter.h"
#include "vlm/runtime/device_staging.h"
#include "vlm/model/tensor_parallel.h"

namespace vlm {

VisionLanguageModelImpl::VisionLanguageModelImpl(const VlmConfig& c, const torch::TensorOptions& opts)
    : cfg(c), runner_(std::make_shared<UnitRunner>()) {
  validate(cfg, "model config");
  visual = register_module("visual", family_spec(cfg.family).make_vision(cfg, opts));
  model = register_module("model", LanguageModel(cfg.text, opts));
  if (!cfg.tie_word_embeddings) {
    const int64_t tp = std::max<int64_t>(1, cfg.text.tensor_parallel);
    lm_head = register_module("lm_head", Linear(cfg.text.hidden_size, cfg.text.vocab_size / tp, false, opts));
  }
}

void VisionLanguageModelImpl::set_tensor_exchange(std::shared_ptr<SequenceExchange> exchange) {
  const int64_t n = exchange ? exchange->size() : 1;
  VLM_CHECK(n == std::max<int64_t>(1, cfg.text.tensor_parallel), "set_tensor_exchange: the model was built for tp = ",
            cfg.text.tensor_parallel, " but the exchange has ", n, " ranks (hint: set cfg.text.tensor_parallel before "
            "building the model)");
  tp_ = n > 1 ? std::move(exchange) : nullptr;
}

void VisionLanguageModelImpl::set_runner(std::shared_ptr<UnitRunner> runner) {
  VLM_CHECK(runner != nullptr, "set_runner: runner must not be null");
  runner_ = std::move(runner);
}

std::vector<Unit> VisionLanguageModelImpl::units() {
  std::vector<Unit> u;
  visual->append_units(u, "visual");
  u.push_back({"model.embed_tokens", model->embed_tokens.get(), "", /*backward_reads_params=*/false});
  for (size_t i = 0; i < model->layers.size(); ++i)
    u.push_back({"model.layers." + std::to_string(i), model->layers[i].get(), ""});
  u.push_back({"model.norm", model->norm.get(), ""});
  if (lm_head) {
    u.push_back({"lm_head", lm_head.get(), ""});
  } else {
    u.push_back({"lm_head", model->embed_tokens.get(), "model.embed_tokens"});
  }
  return u;
}

VisionOutput VisionLanguageModelImpl::image_features(const torch::Tensor& pixel_values, const torch::Tensor& grid_thw,
                                                     SequenceExchange* sp) {
  return visual->encode(pixel_values, grid_thw, *runner_, "visual", sp);
}

torch::Tensor VisionLanguageModelImpl::head(const torch::Tensor& hidden) {
  if (tp_) {  // this rank's vocabulary slice of the logits, gathered
    torch::nn::Module& unit = lm_head ? static_cast<torch::nn::Module&>(*lm_head) : *model->embed_tokens;
    return runner_->run("lm_head", unit, hidden, [head = lm_head, emb = model->embed_tokens,
                                                  tp = tp_](const torch::Tensor& x) mutable {
      return tp_all_gather(*tp, torch::linear(x, head ? head->weight : emb->weight), -1, "tensor parallel: logits");
    });
  }
  if (lm_head) {
    return runner_->run("lm_head", *lm_head, hidden, [head = lm_head](const torch::Tensor& x) mutable { return head(x); });
  }
  auto& emb = model->embed_tokens;
  return runner_->run("lm_head", *emb, hidden,
                      [emb](const torch::Tensor& x) mutable { return torch::linear(x, emb->weight); });
}

torch::Tensor VisionLanguageModelImpl::head_loss(const torch::Tensor& hidden, const torch::Tensor& labels) {
  if (tp_) {
    torch::nn::Module& unit = lm_head ? static_cast<torch::nn::Module&>(*lm_head) : *model->embed_tokens;
    const bool tied = !lm_head;
    // Every rank computes the whole loss (its backward: this rank's vocabulary slice); its value
    // counts 1 / tp on each, so that the ranks' values sum to the loss (tensor_parallel.h).
    auto loss = runner_->run("lm_head", unit, hidden, [head = lm_head, emb = model->embed_tokens, tied, labels,
                                                       tp = tp_](const torch::Tensor& x) mutable {
      return vocab_parallel_cross_entropy(*tp, x, tied ? emb->weight : head->weight, labels);
    });
    return loss + (loss / static_cast<double>(tp_->size()) - loss).detach();
  }
  if (lm_head) {
    return runner_->run("lm_head", *lm_head, hidden, [head = lm_head, labels](const torch::Tensor& x) mutable {
      return chunked_linear_cross_entropy(x, head->weight, labels);
    });
  }
  auto& emb = model->embed_tokens;
  return runner_->run("lm_head", *emb, hidden, [emb, labels](const torch::Tensor& x) mutable {
    return chunked_linear_cross_entropy(x, emb->weight, labels);
  });
}

torch::Tensor VisionLanguageModelImpl::embed_inputs(const Batch& batch, bool dummy_vision, torch::Tensor* zero_term,
                                        DeepStackInputs* deepstack, SequenceExchange* sp) {
  const auto& ids = batch.input_ids;
  VLM_CHECK(ids.defined() && ids.dim() == 2, "input_ids: expected [B, L] int64, got ",
            ids.defined() ? ids.sizes() : torch::IntArrayRef{});
  const bool has_image = batch.pixel_values.defined() && batch.pixel_values.size(0) > 0;
  torch::Tensor features;
  std::vector<torch::Tensor> deep;
  if (has_image) {
    VLM_CHECK(batch.image_grid_thw.defined(), "pixel_values given without image_grid_thw");
    auto vo = image_features(batch.pixel_values, batch.image_grid_thw, sp);  // [M, d]
    features = vo.features;
    deep = std::move(vo.deepstack);
  } else if (dummy_vision) {
    const auto& v = cfg.vision;
    const auto w = visual->first_weight();
    auto grid = torch::tensor({int64_t{1}, v.spatial_merge_size, v.spatial_merge_size}, torch::kInt64).view({1, 3});
    auto pixels = torch::zeros({v.merge_unit(), v.patch_dim()}, w.options());
    auto dummy = image_features(pixels, grid, sp);
    auto sum = dummy.features.sum().to(torch::kFloat32);
    for (const auto& d : dummy.deepstack) sum = sum + d.sum().to(torch::kFloat32);
    if (zero_term) *zero_term = sum * 0.0;
  }
  auto embeds = model->embed(ids, *runner_, "model", tp_.get());  // [B, L, d]
  const int64_t n_feat = features.defined() ? features.size(0) : 0;
  // The image pad positions: collate's image_rows (host-built, staged), else found here from
  // host ids. On a device without image_rows the count check and the placement fall back to
  // a mask (a host sync in backward: evaluation and generation only).
  torch::Tensor rows = batch.image_rows;
  if (!rows.defined() && ids.is_cpu()) rows = image_token_rows(ids, cfg.image_token_id);
  if (rows.defined()) {
    VLM_CHECK(rows.size(0) == n_feat, "the batch has ", rows.size(0), " image tokens (id ", cfg.image_token_id,
              ") but the images give ", n_feat, " features (hint: each image needs t*gh*gw/",
              cfg.vision.merge_unit(), " <|image_pad|> tokens)");
    rows = stage_to_device(rows, embeds.device());
  }
  if (n_feat == 0) return embeds;
  // Image features replace the pad embeddings in order (HF's masked_scatter: the pad rows of
  // embed_tokens get no gradient). By index (row_scatter.h): fixed shapes, no sync.
  const auto f = features.to(embeds.scalar_type());
  if (rows.defined()) {
    if (deepstack != nullptr && !deep.empty()) *deepstack = {torch::Tensor(), rows, std::move(deep)};
    return replace_rows(embeds.reshape({-1, embeds.size(-1)}), rows, f).view_as(embeds);
  }
  auto image_pos = ids == cfg.image_token_id;  // [B, L]
  if (deepstack != nullptr && !deep.empty()) *deepstack = {image_pos, torch::Tensor(), std::move(deep)};
  return embeds.masked_scatter(image_pos.unsqueeze(-1).expand_as(embeds), f);
}

torch::Tensor image_token_rows(const torch::Tensor& input_ids, int64_t image_token_id) {
  VLM_CHECK(input_ids.dim() == 2, "input_ids: expected [B, L], got ", input_ids.sizes());
  return (input_ids.reshape({-1}) == image_token_id).nonzero().reshape({-1});
}

torch::Tensor supervised_rows(const torch::Tensor& labels) {
  VLM_CHECK(labels.dim() == 2 && labels.size(1) >= 1, "labels: expected [B, L], got ", labels.sizes());
  const int64_t l = labels.size(1);
  return (labels.narrow(1, 1, l - 1).reshape({-1}) != -100).nonzero().reshape({-1});
}

VisionLanguageModelImpl::DecoderInputs VisionLanguageModelImpl::decoder_inputs(const Batch& batch, int64_t b,
                                                                              int64_t l) {
  const auto& ids = batch.input_ids;
  DecoderInputs in;
  in.full_mask = batch.attention_mask.defined() ? batch.attention_mask
                                                : torch::ones({b, l}, ids.options().dtype(torch::kInt64));
  // Packed row (padding-free packing): per-sample causal attention from the host's cu_seqlens.
  if (batch.text_cu_seqlens.defined()) {
    auto c = batch.text_cu_seqlens.to(torch::kCPU, torch::kInt64).contiguous();
    in.text_cu.assign(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  }
  const bool packed = !in.text_cu.empty();
  in.pos = batch.position_ids;
  if (!in.pos.defined())
    in.pos = packed ? packed_position_ids(ids, batch.image_grid_thw, in.text_cu, cfg)
                    : get_rope_index(ids, batch.image_grid_thw, in.full_mask, cfg).position_ids;
  // Right-padded rows (training) and packed rows: causal attention without a mask tensor.
  if (!(batch.right_padded || packed)) in.mask = in.full_mask;
  return in;
}

ForwardOutput VisionLanguageModelImpl::forward(const Batch& batch, bool return_logits) {
  VLM_CHECK(stage_.whole(), "forward: this model computes pipeline stage ", stage_.index, " of ", stage_.count,
            " (hint: forward_stage, or a model without set_pipeline_stage)");
  const auto& ids = batch.input_ids;
  torch::Tensor zero_term;
  DeepStackInputs deepstack;
  // Training under context parallelism: the vision tower and the decoder split over the group.
  const bool split = sp_ && sp_->size() > 1 && batch.labels.defined() && !return_logits;
  auto embeds = embed_inputs(batch, /*dummy_vision=*/true, &zero_term, &deepstack, split ? sp_.get() : nullptr);
  const int64_t b = embeds.size(0), l = embeds.size(1);
  DecoderInputs in = decoder_inputs(batch, b, l);
  const bool packed = !in.text_cu.empty();
  if (split) {
    auto out = forward_chunk(batch, embeds, in.pos, in.mask, std::move(in.text_cu), deepstack);
    if (zero_term.defined()) out.loss_sum = out.loss_sum + zero_term;
    return out;
  }
  // Mixture of experts with a load-balancing loss: one state for this forward (moe.h).
  std::shared_ptr<RouterAuxState> aux;
  if (batch.router_aux_weight != 0 && cfg.text.count_sparse_layers() > 0) {
    aux = std::make_shared<RouterAuxState>();
    aux->aux_weight = batch.router_aux_weight;
    const auto fopts = embeds.options().dtype(torch::kFloat32);
    if (batch.attention_mask.defined()) {
      aux->token_weight = stage_to_device(batch.attention_mask, embeds.device()).reshape({-1}).to(torch::kFloat32);
      aux->rows = aux->token_weight.sum().clamp_min(1.0);
    } else {
      aux->rows = torch::full({}, static_cast<double>(b * l), fopts);
    }
    aux->grad = torch::zeros({cfg.text.num_experts}, fopts);
  }
  auto hidden = model->forward(embeds, in.pos, in.mask, nullptr, *runner_, "model",
                               deepstack.embeds.empty() ? nullptr : &deepstack, packed ? &in.text_cu : nullptr, aux,
                               nullptr, tp_.get());  // [B, L, d]

  ForwardOutput out;
  if (aux) out.aux_loss = aux->finish(cfg.text.num_experts);
  const bool want_loss = batch.labels.defined();
  if (want_loss) {
    VLM_CHECK(batch.labels.sizes() == ids.sizes(), "labels ", batch.labels.sizes(),
              " must match input_ids ", ids.sizes());
  }
  if (return_logits || !want_loss) {
    auto logits = head(hidden).to(torch::kFloat32);  // [B, L, V]
    if (want_loss) {
      auto lg = logits.narrow(1, 0, l - 1).reshape({-1, logits.size(2)});
      auto lb = stage_to_device(batch.labels.narrow(1, 1, l - 1).reshape({-1}), lg.device(), torch::kInt64);
      out.n_tokens = (lb != -100).sum().item<int64_t>();
      out.loss_sum = torch::nn::functional::cross_entropy(
          lg, lb, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
    }
    if (return_logits) out.logits = logits;
  } else {
    ForwardOutput loss = training_loss(batch, hidden);
    out.loss_sum = loss.loss_sum;
    out.n_tokens = loss.n_tokens;
  }
  if (out.loss_sum.defined() && zero_term.defined()) out.loss_sum = out.loss_sum + zero_term;
  return out;
}

ForwardOutput VisionLanguageModelImpl::training_loss(const Batch& batch, const torch::Tensor& hidden) {
  // Head only on supervised positions, over row chunks (chunked_cross_entropy.h): neither
  // the [B, L, V] nor the [n, V] logits exist whole. loss_rows from the host: no sync.
  const int64_t l = hidden.size(1), d = hidden.size(2);
  ForwardOutput out;
  auto keep = stage_to_device(batch.loss_rows.defined() ? batch.loss_rows : supervised_rows(batch.labels), hidden.device());
  out.n_tokens = keep.size(0);
  auto lb = batch.labels.narrow(1, 1, l - 1).reshape({-1});
  lb = stage_to_device(lb, hidden.device(), torch::kInt64).index_select(0, keep);
  auto h = hidden.narrow(1, 0, l - 1).reshape({-1, d}).index_select(0, keep);  // [n, d]
  out.loss_sum = head_loss(h, lb);
  return out;
}

void VisionLanguageModelImpl::set_pipeline_stage(const PipelineStage& stage) {
  const int64_t n = cfg.text.num_hidden_layers;
  const int64_t end = stage.end_layer < 0 ? n : stage.end_layer;
  VLM_CHECK(stage.count >= 1 && stage.index >= 0 && stage.index < stage.count && stage.first_layer >= 0 &&
                stage.first_layer < end && end <= n,
            "set_pipeline_stage: stage ", stage.index, " of ", stage.count, " with layers [", stage.first_layer, ", ",
            end, ") does not fit the model's ", n, " decoder layers");
  const int64_t deepstack = static_cast<int64_t>(cfg.vision.deepstack_visual_indexes.size());
  VLM_CHECK(!stage.first() || stage.last() || end >= deepstack, "set_pipeline_stage: stage 0 must hold the ",
            deepstack, " decoder layers that take DeepStack features, but holds [0, ", end, ")");
  stage_ = stage;
  stage_.end_layer = end;
  model->set_layer_range(stage_.first_layer, end, stage_.last());
}

VisionLanguageModelImpl::StageOutput VisionLanguageModelImpl::forward_stage(const Batch& batch,
                                                                            const torch::Tensor& input) {
  VLM_CHECK(batch.labels.defined(), "forward_stage: a training forward needs labels");
  VLM_CHECK(!(sp_ && sp_->size() > 1), "forward_stage: pipeline parallelism with context parallelism is not built yet");
  VLM_CHECK(batch.router_aux_weight == 0 || cfg.text.count_sparse_layers() == 0,
            "pipeline parallelism has no MoE load-balancing loss yet (hint: model.router_aux_loss_coef = 0)");
  const auto& ids = batch.input_ids;
  VLM_CHECK(ids.defined() && ids.dim() == 2, "input_ids: expected [B, L] int64, got ",
            ids.defined() ? ids.sizes() : torch::IntArrayRef{});
  const int64_t b = ids.size(0), l = ids.size(1);
  torch::Tensor zero_term, h;
  DeepStackInputs deepstack;
  if (stage_.first()) {
    h = embed_inputs(batch, /*dummy_vision=*/true, &zero_term, &deepstack);
  } else {
    const int64_t len = tp_ ? sequence_chunk(l, tp_->size(), tp_->rank()).len : l;  // tp: this rank's chunk
    VLM_CHECK(input.defined() && input.dim() == 3 && input.size(0) == b && input.size(1) == len &&
                  input.size(2) == cfg.text.hidden_size,
              "forward_stage: stage ", stage_.index, " expects the previous stage's [", b, ", ", len, ", ",
              cfg.text.hidden_size, "], got ", input.defined() ? input.sizes() : torch::IntArrayRef{});
    h = input;
  }
  DecoderInputs in = decoder_inputs(batch, b, l);
  const bool packed = !in.text_cu.empty();
  auto hidden = model->forward(h, in.pos, in.mask, nullptr, *runner_, "model",
                               deepstack.embeds.empty() ? nullptr : &deepstack, packed ? &in.text_cu : nullptr,
                               nullptr, nullptr, tp_.get());  // [B, L, d]
  StageOutput r;
  if (!stage_.last()) {
    r.hidden = zero_term.defined() ? hidden + zero_term.to(hidden.scalar_type()) : hidden;
    return r;
  }
  VLM_CHECK(batch.labels.sizes() == ids.sizes(), "labels ", batch.labels.sizes(), " must match input_ids ", ids.sizes());
  r.out = training_loss(batch, hidden);
  return r;
}

ForwardOutput VisionLanguageModelImpl::forward_chunk(const Batch& batch, torch::Tensor embeds, torch::Tensor pos,
                                                   torch::Tensor mask, std::vector<int64_t> text_cu,
                                                   const DeepStackInputs& deepstack) {
  VLM_CHECK(batch.router_aux_weight == 0 || cfg.text.count_sparse_layers() == 0,
            "sequence parallelism (dist.cp) has no load-balancing loss yet (hint: model.router_aux_loss_coef = 0)");
  const auto dev = embeds.device();
  const int64_t b = embeds.size(0), l = embeds.size(1), d = embeds.size(2);
  const SequenceLayout lay = sequence_layout(l, sp_->size(), sp_->rank(), sp_->mode());
  const int64_t pad = lay.padded - l;
  // Padding to the layout's multiple: after every real token (causal attention never reaches
  // it), masked as a key, its own packed segment, position = the last one's.
  if (pad > 0) {
    embeds = torch::cat({embeds, torch::zeros({b, pad, d}, embeds.options())}, 1);
    pos = torch::cat({pos, pos.narrow(2, l - 1, 1).expand({3, b, pad})}, 2);
    if (mask.defined()) mask = torch::cat({mask, torch::zeros({b, pad}, mask.options())}, 1);
    if (!text_cu.empty()) text_cu.push_back(lay.padded);
  }
  // DeepStack features (Qwen3-VL) as this rank's dense addends: zero but at image tokens.
  DeepStackInputs ds;
  if (!deepstack.embeds.empty()) {
    ds.dense = true;
    for (const auto& e : deepstack.embeds) {
      torch::Tensor full;
      if (deepstack.rows.defined()) {  // flat rows b*L+t -> b*padded+t
        auto rows = deepstack.rows + deepstack.rows.div(l, "floor") * pad;
        full = add_rows(torch::zeros({b * lay.padded, d}, e.options()), rows, e).view({b, lay.padded, d});
      } else {
        auto m = stage_to_device(deepstack.mask, dev).to(torch::kBool);
        if (pad > 0) m = torch::cat({m, torch::zeros({b, pad}, m.options())}, 1);
        full = torch::zeros({b, lay.padded, d}, e.options())
                   .masked_scatter(m.unsqueeze(-1).expand({b, lay.padded, d}), e);
      }
      ds.embeds.push_back(gather_layout(full, 1, lay));
    }
  }
  // A copy of this rank's tokens, so that the whole micro-batch's embeddings are not kept
  // alive through a view (one run's narrow is one; ring's two runs are concatenated).
  auto mine = gather_layout(embeds, 1, lay);
  if (lay.runs.size() == 1) mine = mine.clone();
  auto hidden = model->forward(mine, gather_layout(pos, 2, lay), mask, nullptr, *runner_, "model",
                               ds.embeds.empty() ? nullptr : &ds, text_cu.empty() ? nullptr : &text_cu, nullptr,
                               sp_.get());  // [B, Ls, d]
  // The micro-batch's supervised rows (a count known on the host: no sync), those this rank
  // does not hold ignored (label -100): flat row b*(L-1)+t predicts labels[b, t+1].
  ForwardOutput out;
  auto keep = stage_to_device(batch.loss_rows.defined() ? batch.loss_rows : supervised_rows(batch.labels), dev);
  out.n_tokens = keep.size(0);
  const int64_t step = std::max<int64_t>(l - 1, 1);
  auto row = keep.div(step, "floor"), t = keep - row * step;
  auto labels = stage_to_device(batch.labels, dev, torch::kInt64);
  auto next = labels.reshape({-1}).index_select(0, row * l + t + 1);
  auto at = stage_to_device(layout_local_index(lay), dev).index_select(0, t);  // local index, -1: not held
  next = torch::where(at.ge(0), next, torch::full({}, -100, next.options()));
  auto local = row * lay.len + at.clamp_min(0);
  out.loss_sum = head_loss(hidden.reshape({-1, d}).index_select(0, local), next);
  return out;
}

}  // namespace vlm
