#include "vlm/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>

#include "vlm/check.h"
#include "vlm/rope_index.h"

namespace vlm {
namespace {

// logits: [B, V] fp32 -> next tokens [B] int64.
torch::Tensor pick(const torch::Tensor& logits, const GenerationOptions& o, at::Generator& gen) {
  if (o.temperature <= 0.0) return logits.argmax(-1);
  auto probs = torch::softmax(logits.to(torch::kCPU) / o.temperature, -1);
  if (o.top_p < 1.0) {
    auto sorted = probs.sort(-1, /*descending=*/true);
    auto p = std::get<0>(sorted), idx = std::get<1>(sorted);
    auto before = p.cumsum(-1) - p;  // mass strictly before each token
    p = p.masked_fill(before >= o.top_p, 0.0);
    probs = torch::zeros_like(probs).scatter(-1, idx, p);
  }
  return torch::multinomial(probs, 1, false, gen).view({-1}).to(logits.device());
}

}  // namespace

GenerationOutput generate(Qwen2VLImpl& model, const Batch& prompt, const GenerationOptions& o) {
  torch::NoGradGuard no_grad;
  const auto& ids0 = prompt.input_ids;
  VLM_CHECK(ids0.defined() && ids0.dim() == 2, "generate: input_ids must be [B, L]");
  const int64_t b = ids0.size(0), l0 = ids0.size(1);
  const auto dev = ids0.device();
  auto mask = prompt.attention_mask.defined() ? prompt.attention_mask.to(torch::kInt64)
                                              : torch::ones({b, l0}, ids0.options().dtype(torch::kInt64));
  if (b > 0 && l0 > 0) {
    VLM_CHECK(mask.select(1, l0 - 1).all().item<bool>(),
              "generate: prompts must be LEFT-padded (the last column of attention_mask is 0 somewhere)");
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  GenerationOutput out;
  out.tokens.assign(b, {});
  std::vector<bool> done(b, false);
  std::vector<torch::Tensor> step_logits;
  auto ids = ids0;  // grows by one column per step (used without cache)
  KvCache cache;
  torch::Tensor deltas;
  auto& runner = model.runner();

  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    torch::Tensor last;  // [B, d]
    if (!o.use_cache || step == 0) {
      Batch full = prompt;
      full.input_ids = ids;
      full.attention_mask = mask;
      auto embeds = model.embed_inputs(full, o.dummy_vision, nullptr);
      auto rope = get_rope_index(ids, prompt.image_grid_thw, mask, model.cfg);
      deltas = rope.rope_deltas.to(dev);
      auto hidden = model.model->forward(embeds, rope.position_ids, mask, o.use_cache ? &cache : nullptr,
                                         runner, "model");
      last = hidden.select(1, hidden.size(1) - 1);
    } else {
      auto tok = ids.narrow(1, ids.size(1) - 1, 1);  // [B, 1]
      auto embeds = model.model->embed(tok, runner, "model");
      // Position of the new token: cache index + rope delta, on all three streams.
      auto pos = (deltas + cache.length()).view({1, b, 1}).expand({3, b, 1}).contiguous();
      auto hidden = model.model->forward(embeds, pos, mask, &cache, runner, "model");
      last = hidden.select(1, 0);
    }
    auto logits = model.head(last).to(torch::kFloat32);  // [B, V]
    if (o.keep_logits) step_logits.push_back(logits);
    // A generated <|image_pad|> / <|video_pad|> would have no image behind it: never pick one.
    auto pickable = logits.clone();
    pickable.select(1, model.cfg.image_token_id).fill_(-std::numeric_limits<float>::infinity());
    if (model.cfg.video_token_id < pickable.size(1))
      pickable.select(1, model.cfg.video_token_id).fill_(-std::numeric_limits<float>::infinity());
    auto next = pick(pickable, o, gen).to(torch::kCPU);
    auto* nd = next.data_ptr<int64_t>();
    for (int64_t i = 0; i < b; ++i) {
      if (done[i]) {
        nd[i] = o.pad_token_id;
        continue;
      }
      out.tokens[i].push_back(nd[i]);
      if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), nd[i]) != o.stop_tokens.end()) done[i] = true;
    }
    ids = torch::cat({ids, next.to(dev).view({b, 1})}, 1);
    mask = torch::cat({mask, torch::ones({b, 1}, mask.options())}, 1);
    const bool all_done = std::all_of(done.begin(), done.end(), [](bool d) { return d; });
    if (o.stop_together ? o.stop_together(all_done) : (!o.run_to_max && all_done)) break;
  }
  if (o.keep_logits && !step_logits.empty()) out.logits = torch::stack(step_logits, 1);
  return out;
}

}  // namespace vlm
