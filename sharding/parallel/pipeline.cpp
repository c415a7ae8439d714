#include "sharding/parallel/pipeline.h"

#include <algorithm>

#include "vlm/runtime/check.h"

namespace vlm::sharding {

PipelineCosts pipeline_unit_costs(vlm::VisionLanguageModelImpl& model) {
  const vlm::TextConfig& t = model.cfg.text;
  PipelineCosts c;
  for (int64_t i = 0; i < t.num_hidden_layers; ++i) {
    double n = 0;
    for (const auto& p : model.model->layers[i]->named_parameters()) {
      double k = static_cast<double>(p.value().numel());
      // A routed expert's weights meet top-k / E of the tokens.
      if (p.key().find("mlp.experts.") != std::string::npos && t.num_experts > 0)
        k *= static_cast<double>(t.num_experts_per_tok) / static_cast<double>(t.num_experts);
      n += k;
    }
    c.layers.push_back(n);
  }
  for (const auto& p : model.visual->parameters()) c.first += static_cast<double>(p.numel());
  // The head: this rank's vocabulary rows (tensor parallelism splits them, as the layers'
  // parameters above are this rank's slices; the vision tower is whole on every rank).
  c.last = static_cast<double>(t.hidden_size) * static_cast<double>(t.vocab_size) /
           static_cast<double>(std::max<int64_t>(1, t.tensor_parallel));
  return c;
}

std::vector<vlm::PipelineStage> pipeline_split(vlm::VisionLanguageModelImpl& model, int64_t pp) {
  const PipelineCosts c = pipeline_unit_costs(model);
  const int64_t deepstack = static_cast<int64_t>(model.cfg.vision.deepstack_visual_indexes.size());
  return vlm::pipeline_stages(c.layers, c.first, c.last, pp, std::max<int64_t>(1, deepstack));
}

vlm::PipelineStage apply_pipeline_parallel(vlm::VisionLanguageModelImpl& model, ParallelDims& dims) {
  if (dims.pp() == 1) return model.pipeline_stage();
  const vlm::PipelineStage s = pipeline_split(model, dims.pp()).at(static_cast<size_t>(dims.pp_rank()));
  model.set_pipeline_stage(s);
  return model.pipeline_stage();
}

std::vector<UnitPlan> keep_stage_units(const std::vector<UnitPlan>& units, const vlm::PipelineStage& stage) {
  if (stage.whole()) return units;
  auto runs = [&](const UnitPlan& u) {
    const std::string& path = !u.adapter_of.empty() ? u.adapter_of : !u.experts_of.empty() ? u.experts_of : u.path;
    if (stage.runs(path)) return true;
    if (path != u.path) return false;
    size_t start = 0;  // aliases: comma-separated (a tied head)
    while (start < u.aliases.size()) {
      const size_t comma = u.aliases.find(',', start);
      if (stage.runs(u.aliases.substr(start, comma == std::string::npos ? std::string::npos : comma - start)))
        return true;
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return false;
  };
  std::vector<UnitPlan> out;
  for (const auto& u : units)
    if (runs(u)) out.push_back(u);
  return out;
}

PipelineSchedule::PipelineSchedule(ParallelDims& dims, int64_t hidden, torch::TensorOptions act)
    : dims_(dims), hidden_(hidden), act_(act), stage_(dims.pp_rank()), stages_(dims.pp()) {}

std::vector<int64_t> PipelineSchedule::shape(int64_t k) const {
  const auto [b, l] = step_->rows_and_length(k);
  const int64_t tp = dims_.tp();  // tensor parallelism: this rank's sequence chunk
  return {b, tp > 1 ? (l + tp - 1) / tp : l, hidden_};
}

torch::Tensor PipelineSchedule::exchange(Comm& link, bool earlier, const torch::Tensor& send, bool recv, int64_t k,
                                         const std::string& what) {
  const torch::Tensor in = send.defined() ? send.detach().contiguous().view({-1}) : torch::empty({0}, act_);
  VLM_CHECK(!send.defined() || send.scalar_type() == act_.dtype().toScalarType(), "pipeline: ", what, " is ",
            send.scalar_type(), ", expected the activation dtype ", act_.dtype());
  const std::vector<int64_t> sh = shape(k);
  const int64_t n_out = recv ? sh[0] * sh[1] * sh[2] : 0;
  torch::Tensor out = torch::empty({n_out}, act_);
  const int64_t n_in = in.numel();
  const std::vector<int64_t> in_splits = earlier ? std::vector<int64_t>{0, n_in} : std::vector<int64_t>{n_in, 0};
  const std::vector<int64_t> out_splits = earlier ? std::vector<int64_t>{0, n_out} : std::vector<int64_t>{n_out, 0};
  link.all_to_all(out, in, out_splits, in_splits, what);
  sent_bytes_ += static_cast<double>(n_in) * static_cast<double>(in.element_size());
  return recv ? out.view(sh) : torch::Tensor();
}

void PipelineSchedule::forward(int64_t k, const std::string& ctx) {
  Slot& s = slots_[k];
  s.output = step_->forward(k, s.input);
  VLM_CHECK(s.output.defined(), ctx, ": pipeline stage ", stage_, " gave no output for micro-batch ", k);
}

void PipelineSchedule::backward(int64_t k, const torch::Tensor& grad, const std::string& ctx) {
  Slot& s = slots_[k];
  if (step_->before_backward) step_->before_backward(k);
  if (!s.output.requires_grad()) {
    // Nothing on or before this stage trains (a frozen stage after frozen ones): no graph.
  } else if (stage_ == stages_ - 1) {
    s.output.backward();
  } else {
    VLM_CHECK(grad.defined() && grad.sizes() == s.output.sizes(), ctx, ": pipeline stage ", stage_,
              ": the gradient of micro-batch ", k, " is ", grad.defined() ? grad.sizes() : torch::IntArrayRef{},
              ", its output ", s.output.sizes());
    torch::autograd::backward({s.output}, {grad});
  }
  if (step_->after_backward) step_->after_backward(k);
  s.output = torch::Tensor();
}

void PipelineSchedule::run(const PipelineStep& step, const std::string& ctx) {
  const int64_t m = step.micro_batches, p = stages_, st = stage_;
  VLM_CHECK(m >= 1, ctx, ": a pipeline step needs at least one micro-batch");
  step_ = &step;
  slots_.assign(static_cast<size_t>(m), Slot{});
  sent_bytes_ = 0;
  const bool first = st == 0, last = st == p - 1;
  auto tag = [&](const char* what, int64_t k) { return vlm::str(ctx, ", pipeline ", what, " of micro-batch ", k); };
  // The link ops (see the header comment); no-ops at the pipeline's ends.
  auto recv_forward = [&](int64_t k) {
    if (first) return;
    slots_[k].input = exchange(dims_.pp_prev(), false, {}, true, k, tag("receive activations", k)).requires_grad_(true);
  };
  auto send_forward = [&](int64_t k) {
    if (!last) exchange(dims_.pp_next(), true, slots_[k].output, false, k, tag("send activations", k));
  };
  // Sends micro-batch kf's activations, receives micro-batch kb's gradient.
  auto send_forward_recv_backward = [&](int64_t kf, int64_t kb) {
    if (last) return torch::Tensor();
    // The receive is kb's gradient (exchange() sizes it by kb), the send kf's activations.
    return exchange(dims_.pp_next(), true, slots_[kf].output, true, kb, tag("send activations / receive gradient", kb));
  };
  auto input_grad = [&](int64_t k) {
    torch::Tensor g = first ? torch::Tensor() : slots_[k].input.grad();
    if (!first && !g.defined()) g = torch::zeros_like(slots_[k].input);  // the stage did not use its input
    slots_[k].input = torch::Tensor();
    return g;
  };
  auto send_backward = [&](const torch::Tensor& g, int64_t k) {
    if (!first) exchange(dims_.pp_prev(), false, g, false, k, tag("send gradient", k));
  };
  // Sends micro-batch kb's input gradient, receives micro-batch kf's activations.
  auto send_backward_recv_forward = [&](const torch::Tensor& g, int64_t kb, int64_t kf) {
    if (first) return;
    slots_[kf].input =
        exchange(dims_.pp_prev(), false, g, true, kf, tag("send gradient / receive activations", kb)).requires_grad_(true);
  };
  auto recv_backward = [&](int64_t k) {
    if (last) return torch::Tensor();
    return exchange(dims_.pp_next(), true, {}, true, k, tag("receive gradient", k));
  };

  const int64_t warm = std::min(p - 1 - st, m), steady = m - warm;
  int64_t f = 0, b = 0;
  for (int64_t i = 0; i < warm; ++i, ++f) {
    recv_forward(f);
    forward(f, ctx);
    send_forward(f);  // the output stays in its slot for its backward
  }
  if (steady > 0) recv_forward(f);
  for (int64_t i = 0; i < steady; ++i, ++f, ++b) {
    forward(f, ctx);
    const torch::Tensor g = send_forward_recv_backward(f, b);
    backward(b, g, ctx);
    const torch::Tensor gin = input_grad(b);
    if (i == steady - 1)
      send_backward(gin, b);
    else
      send_backward_recv_forward(gin, b, f + 1);
  }
  for (int64_t i = 0; i < warm; ++i, ++b) {
    const torch::Tensor g = recv_backward(b);
    backward(b, g, ctx);
    send_backward(input_grad(b), b);
  }
  slots_.clear();
  step_ = nullptr;
}

}  // namespace vlm::sharding
