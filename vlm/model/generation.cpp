#include "vlm/model/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "vlm/runtime/check.h"
#include "vlm/model/rope_index.h"

namespace vlm {
namespace {

// logits: [B, V] fp32 -> next tokens [B] int64. Sampling follows HF's warper order:
// temperature, top-k (ties with the k-th value kept), top-p.
torch::Tensor pick(const torch::Tensor& logits, const GenerationOptions& o, at::Generator& gen) {
  if (o.temperature <= 0.0) return logits.argmax(-1);
  auto scores = logits.to(torch::kCPU) / o.temperature;
  if (o.top_k > 0 && o.top_k < scores.size(-1)) {
    auto kth = std::get<0>(scores.topk(o.top_k, -1)).narrow(-1, o.top_k - 1, 1);
    scores = scores.masked_fill(scores < kth, -std::numeric_limits<float>::infinity());
  }
  auto probs = torch::softmax(scores, -1);
  if (o.top_p < 1.0) {
    auto sorted = probs.sort(-1, /*descending=*/true);
    auto p = std::get<0>(sorted), idx = std::get<1>(sorted);
    auto before = p.cumsum(-1) - p;  // mass strictly before each token
    p = p.masked_fill(before >= o.top_p, 0.0);
    probs = torch::zeros_like(probs).scatter(-1, idx, p);
  }
  return torch::multinomial(probs, 1, false, gen).view({-1}).to(logits.device());
}

// HF's RepetitionPenaltyLogitsProcessor on logits [B, V] given seen [B, V] bool.
torch::Tensor penalize(const torch::Tensor& logits, const torch::Tensor& seen, double penalty) {
  auto penalized = torch::where(logits < 0, logits * penalty, logits / penalty);
  return torch::where(seen, penalized, logits);
}

double number(const nlohmann::json& v, const std::string& key, const std::string& src) {
  VLM_CHECK(v.is_number(), src, ": key '", key, "' must be a number, found ", v.dump().substr(0, 64));
  return v.get<double>();
}

int64_t integer(const nlohmann::json& v, const std::string& key, const std::string& src) {
  VLM_CHECK(v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX)),
            src, ": key '", key, "' must be an integer, found ", v.dump().substr(0, 64));
  return v.get<int64_t>();
}

}  // namespace

nlohmann::json GenerationConfig::to_json() const {
  return {{"do_sample", do_sample},
          {"temperature", temperature},
          {"top_k", top_k},
          {"top_p", top_p},
          {"repetition_penalty", repetition_penalty},
          {"eos_token_id", eos_token_ids},
          {"pad_token_id", pad_token_id ? nlohmann::json(*pad_token_id) : nlohmann::json()},
          {"source", source}};
}

GenerationConfig parse_generation_config(const std::string& text, const std::string& src) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw Error(str(src, ": not valid JSON: ", e.what()));
  }
  VLM_CHECK(j.is_object(), src, ": expected a JSON object at the top level");
  GenerationConfig g;
  g.source = src;
  auto has = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  if (has("do_sample")) {
    VLM_CHECK(j["do_sample"].is_boolean(), src, ": key 'do_sample' must be true or false, found ",
              j["do_sample"].dump());
    g.do_sample = j["do_sample"].get<bool>();
  }
  if (has("temperature")) g.temperature = number(j["temperature"], "temperature", src);
  if (has("top_k")) g.top_k = integer(j["top_k"], "top_k", src);
  if (has("top_p")) g.top_p = number(j["top_p"], "top_p", src);
  if (has("repetition_penalty"))
    g.repetition_penalty = number(j["repetition_penalty"], "repetition_penalty", src);
  if (has("eos_token_id")) {
    const auto& e = j["eos_token_id"];
    if (e.is_array()) {
      for (size_t i = 0; i < e.size(); ++i) g.eos_token_ids.push_back(integer(e[i], str("eos_token_id[", i, "]"), src));
    } else {
      g.eos_token_ids.push_back(integer(e, "eos_token_id", src));
    }
  }
  if (has("pad_token_id")) g.pad_token_id = integer(j["pad_token_id"], "pad_token_id", src);
  VLM_CHECK(std::isfinite(g.repetition_penalty) && g.repetition_penalty > 0, src,
            ": repetition_penalty is ", g.repetition_penalty, ", expected a number > 0 (1 = off)");
  VLM_CHECK(g.top_k >= 0, src, ": top_k is ", g.top_k, ", expected >= 0 (0 = off)");
  VLM_CHECK(std::isfinite(g.top_p) && g.top_p > 0 && g.top_p <= 1, src, ": top_p is ", g.top_p,
            ", expected a number in (0, 1]");
  VLM_CHECK(std::isfinite(g.temperature) && (g.temperature > 0 || !g.do_sample), src,
            ": temperature is ", g.temperature, ", expected a number > 0 when do_sample is true");
  return g;
}

GenerationConfig load_generation_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(model_dir) / "generation_config.json";
  if (!fs::exists(path)) return {};
  std::ifstream in(path, std::ios::binary);
  VLM_CHECK(in.good(), "cannot read ", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_generation_config(ss.str(), path.string());
}

GenerationOptions to_options(const GenerationConfig& gc, GenerationOptions o) {
  o.temperature = gc.do_sample ? gc.temperature : 0.0;
  o.top_k = gc.do_sample ? gc.top_k : 0;
  o.top_p = gc.do_sample ? gc.top_p : 1.0;
  o.repetition_penalty = gc.repetition_penalty;
  if (!gc.eos_token_ids.empty()) o.stop_tokens = gc.eos_token_ids;
  if (gc.pad_token_id) o.pad_token_id = *gc.pad_token_id;
  return o;
}

GenerationOutput generate(VisionLanguageModelImpl& model, const Batch& prompt, const GenerationOptions& o) {
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
  VLM_CHECK(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0,
            "generate: repetition_penalty is ", o.repetition_penalty, ", expected > 0 (1 = off)");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const int64_t vocab = model.cfg.text.vocab_size;
  // Tokens seen per row, for the repetition penalty: as HF, the prompt from its first
  // unmasked column on (left padding excluded; a row with no real token counts all).
  torch::Tensor seen;
  const bool penalize_repeats = o.repetition_penalty != 1.0;
  if (penalize_repeats) {
    auto first = (mask != 0).to(torch::kInt32).argmax(1, /*keepdim=*/true);  // [B, 1]
    auto cols = torch::arange(l0, mask.options()).view({1, l0});
    auto idx = ids0.to(torch::kInt64).masked_fill(cols < first, vocab).clamp(0, vocab);
    seen = torch::zeros({b, vocab + 1}, torch::TensorOptions().dtype(torch::kBool).device(dev));
    seen.scatter_(1, idx, true);
    seen = seen.narrow(1, 0, vocab).contiguous();
  }
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
      DeepStackInputs deepstack;  // Qwen3-VL: image features added after the first layers
      auto embeds = model.embed_inputs(full, o.dummy_vision, nullptr, &deepstack);
      auto rope = get_rope_index(ids, prompt.image_grid_thw, mask, model.cfg);
      deltas = rope.rope_deltas.to(dev);
      auto hidden = model.model->forward(embeds, rope.position_ids, mask, o.use_cache ? &cache : nullptr,
                                         runner, "model", deepstack.embeds.empty() ? nullptr : &deepstack, nullptr,
                                         nullptr, nullptr, model.tensor_exchange());
      last = hidden.select(1, hidden.size(1) - 1);
    } else {
      auto tok = ids.narrow(1, ids.size(1) - 1, 1);  // [B, 1]
      auto embeds = model.model->embed(tok, runner, "model", model.tensor_exchange());
      // Position of the new token: cache index + rope delta, on all three streams.
      auto pos = (deltas + cache.length()).view({1, b, 1}).expand({3, b, 1}).contiguous();
      auto hidden = model.model->forward(embeds, pos, mask, &cache, runner, "model", nullptr, nullptr, nullptr, nullptr,
                                         model.tensor_exchange());
      last = hidden.select(1, 0);
    }
    auto logits = model.head(last).to(torch::kFloat32);  // [B, V]
    if (o.keep_logits) step_logits.push_back(logits);
    // A generated <|image_pad|> / <|video_pad|> would have no image behind it: never pick one.
    auto pickable = penalize_repeats ? penalize(logits, seen, o.repetition_penalty) : logits.clone();
    if (o.suppress_vision_pads) {
      pickable.select(1, model.cfg.image_token_id).fill_(-std::numeric_limits<float>::infinity());
      if (model.cfg.video_token_id < pickable.size(1))
        pickable.select(1, model.cfg.video_token_id).fill_(-std::numeric_limits<float>::infinity());
    }
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
    if (penalize_repeats) seen.scatter_(1, next.to(dev).view({b, 1}).clamp(0, vocab - 1), true);
    ids = torch::cat({ids, next.to(dev).view({b, 1})}, 1);
    mask = torch::cat({mask, torch::ones({b, 1}, mask.options())}, 1);
    const bool all_done = std::all_of(done.begin(), done.end(), [](bool d) { return d; });
    if (o.stop_together ? o.stop_together(all_done) : (!o.run_to_max && all_done)) break;
  }
  if (o.keep_logits && !step_logits.empty()) out.logits = torch::stack(step_logits, 1);
  return out;
}

}  // namespace vlm
