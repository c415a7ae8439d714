#include "app/eval/evaluator.h"

#include "app/config/data_options.h"
#include "app/report/progress.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "collate/prompt_batch.h"
#include "data/loader.h"
#include "data/pixel_pipeline.h"
#include "data/sample_builder.h"
#include "sharding/dist/comm.h"
#include "vlm/runtime/check.h"
#include "vlm/model/generation.h"

namespace vlm::app {
namespace fs = std::filesystem;
using vlm::data::Record;

// ---------------------------------------------------------------- datasets and options

std::vector<EvalDataset> load_eval_datasets(const Recipe& recipe,
                                            const std::vector<std::string>& jsonl_files) {
  VLM_CHECK(!jsonl_files.empty(), recipe.location("data.eval"),
            ": no evaluation data (expected one or more JSONL files in data.eval, or --data)");
  vlm::data::DatasetOptions dopt = dataset_options(recipe);
  dopt.warn = [](const std::string& m) { spdlog::warn("{}", m); };
  std::vector<EvalDataset> out;
  for (const std::string& file : jsonl_files) {
    vlm::data::Dataset ds = vlm::data::load_dataset({file}, dopt);
    EvalDataset set;
    // Named after the file stem, or the dataset name of a "dataset_info.json#name" entry.
    const size_t hash = file.rfind('#');
    set.name = hash != std::string::npos && !fs::is_regular_file(file) ? file.substr(hash + 1)
                                                                         : fs::path(file).stem().string();
    int k = 1;
    const std::string stem = set.name;
    auto taken = [&](const std::string& n) {
      return std::any_of(out.begin(), out.end(), [&](const EvalDataset& e) { return e.name == n; });
    };
    while (taken(set.name)) set.name = stem + "_" + std::to_string(++k);
    set.records = std::move(ds.records);
    set.bad_at_load = static_cast<int64_t>(ds.bad.size());
    out.push_back(std::move(set));
  }
  return out;
}

EvalGeneration resolve_generation(const EvalSection& e, const std::string& model_dir) {
  EvalGeneration g;
  const vlm::GenerationConfig file = model_dir.empty() ? vlm::GenerationConfig{} : vlm::load_generation_config(model_dir);
  g.config = file;
  const std::string from_file = file.source.empty() ? "default" : file.source;
  auto pick = [&](const char* key, auto& dst, const auto& over, bool in_file) {
    if (over) {
      dst = *over;
      g.origin[key] = "recipe";
    } else {
      g.origin[key] = in_file ? from_file : "default";
    }
  };
  // A key counts as "from the file" when the file exists (absent keys in it are HF's
  // defaults, exactly what HF would use for that file).
  const bool f = !file.source.empty();
  pick("do_sample", g.config.do_sample, e.do_sample, f);
  pick("temperature", g.config.temperature, e.temperature, f);
  pick("top_k", g.config.top_k, e.top_k, f);
  pick("top_p", g.config.top_p, e.top_p, f);
  pick("repetition_penalty", g.config.repetition_penalty, e.repetition_penalty, f);
  g.origin["eos_token_id"] = f && !file.eos_token_ids.empty() ? from_file : "tokenizer";
  g.origin["pad_token_id"] = f && file.pad_token_id ? from_file : "tokenizer";
  g.seed = static_cast<uint64_t>(e.seed);
  VLM_CHECK(!g.config.do_sample || g.config.temperature > 0, "eval.temperature is ",
            g.config.temperature, " with do_sample true (", g.origin["temperature"],
            "); expected > 0 (hint: --set eval.do_sample=false for greedy decoding)");
  return g;
}

nlohmann::json EvalGeneration::to_json() const {
  nlohmann::json j = config.to_json();
  j.erase("source");
  j["seed"] = seed;
  j["origin"] = origin;
  return j;
}

std::string EvalGeneration::describe() const {
  auto at = [&](const char* k) {
    auto it = origin.find(k);
    return it == origin.end() ? std::string() : " (" + it->second + ")";
  };
  std::string s = config.do_sample ? vlm::str("sampling: temperature ", config.temperature, at("temperature"),
                                              ", top_k ", config.top_k, at("top_k"), ", top_p ",
                                              config.top_p, at("top_p"), ", seed ", seed)
                                   : std::string("greedy") + at("do_sample");
  s += vlm::str(", repetition_penalty ", config.repetition_penalty, at("repetition_penalty"));
  if (!config.eos_token_ids.empty()) {
    s += ", eos";
    for (int64_t id : config.eos_token_ids) s += vlm::str(" ", id);
    s += at("eos_token_id");
  }
  return s;
}

EvalOptions eval_options(const Recipe& recipe) {
  const EvalSection& e = recipe.eval;
  EvalOptions o;
  o.max_samples = 0;
  o.batch_size = e.batch_size;
  o.max_new_tokens = e.max_new_tokens;
  o.score.norm = Normalization::from_eval(e);
  o.score.metrics = e.metrics;
  o.max_bad_fraction = recipe.data.max_bad_fraction;
  o.loader_workers = recipe.data.num_workers;
  o.generation = resolve_generation(e, recipe.model.path);
  return o;
}

namespace {

// ---------------------------------------------------------------- per-sample work

// One global sample: set s, record r of that set.
struct Item {
  size_t set = 0;
  size_t record = 0;
};

// A prompt ready for generation, or why it could not be built.
struct Prepared {
  int64_t global = 0;
  vlm::TokenizedSample sample;
  std::string error;  // empty when the prompt is ready
};

// What one rank found for one sample; gathered to every rank.
struct Outcome {
  std::string prediction;
  int64_t generated_tokens = 0;
  std::string error;  // non-empty: skipped
  bool present = false;
};

// The text of the last user turn of the generation prompt ("<image>Read the text.").
std::string prompt_text(const Record& r) {
  const int64_t n = vlm::data::generation_prompt_turns(r);
  for (int64_t i = n - 1; i >= 0; --i)
    if (vlm::data::chatml_role(r.turns[size_t(i)].role) == "user") return r.turns[size_t(i)].content;
  return "";
}

// Ids that end a generated answer: <|im_end|>, <|endoftext|>, the tokenizer's eos.
std::vector<int64_t> stop_tokens(const vlm::Tokenizer& tok, const vlm::VlmConfig& cfg) {
  std::vector<int64_t> ids;
  auto add = [&](std::optional<int64_t> id) {
    if (id && *id >= 0 && *id < cfg.text.vocab_size &&
        std::find(ids.begin(), ids.end(), *id) == ids.end())
      ids.push_back(*id);
  };
  add(tok.token_to_id("<|im_end|>"));
  add(tok.token_to_id("<|endoftext|>"));
  add(tok.specials().eos);
  VLM_CHECK(!ids.empty(), "evaluate: tokenizer ", tok.source(),
            " has no <|im_end|>, <|endoftext|> or eos token to stop generation at");
  return ids;
}

// Generated ids -> text: the stop token and ids the tokenizer does not have (a model whose
// vocabulary is larger than its tokenizer's) are dropped, special tokens skipped.
std::string decode_answer(const vlm::Tokenizer& tok, std::vector<int64_t> ids,
                          const std::vector<int64_t>& stops) {
  if (!ids.empty() && std::find(stops.begin(), stops.end(), ids.back()) != stops.end())
    ids.pop_back();
  ids.erase(std::remove_if(ids.begin(), ids.end(),
                           [&](int64_t id) { return id < 0 || id >= tok.vocab_size(); }),
            ids.end());
  return tok.decode(ids, /*skip_special=*/true);
}

// ---------------------------------------------------------------- gather

// Every rank's bytes, in rank order (two all-gathers: the lengths, then the padded bytes).
std::vector<std::string> all_gather_strings(vlm::sharding::Comm& comm, const std::string& local) {
  const int64_t world = comm.world_size();
  torch::Tensor len = torch::tensor({static_cast<int64_t>(local.size())}, torch::kInt64);
  torch::Tensor lens = torch::empty({world}, torch::kInt64);
  comm.all_gather(lens, len, "eval: gather result sizes");
  int64_t longest = 1;
  for (int64_t r = 0; r < world; ++r) longest = std::max(longest, lens[r].item<int64_t>());
  torch::Tensor in = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(in.data_ptr<uint8_t>(), local.data(), local.size());
  torch::Tensor out = torch::empty({world * longest}, torch::kUInt8);
  comm.all_gather(out, in, "eval: gather results");
  std::vector<std::string> all;
  for (int64_t r = 0; r < world; ++r)
    all.emplace_back(reinterpret_cast<const char*>(out.data_ptr<uint8_t>()) + r * longest,
                     size_t(lens[r].item<int64_t>()));
  return all;
}

nlohmann::json scores_json(const SampleScores& s, const Scorer& scorer) {
  nlohmann::json j = nlohmann::json::object();
  if (scorer.enabled("cer") || scorer.enabled("ned")) {
    j["char_edits"] = s.char_edits;
    j["ref_chars"] = s.ref_chars;
  }
  if (scorer.enabled("cer")) j["cer"] = s.ref_chars ? nlohmann::json(double(s.char_edits) / double(s.ref_chars)) : nlohmann::json();
  if (scorer.enabled("wer")) {
    j["word_edits"] = s.word_edits;
    j["ref_words"] = s.ref_words;
    j["wer"] = s.ref_words ? nlohmann::json(double(s.word_edits) / double(s.ref_words)) : nlohmann::json();
  }
  if (scorer.enabled("ned")) j["ned"] = s.ned;
  if (scorer.enabled("em")) j["em"] = s.exact;
  if (scorer.enabled("anls")) j["anls"] = s.anls;
  if (scorer.enabled("ocrbench")) j["ocrbench"] = s.ocrbench;
  return j;
}

// Summary numbers of `s` into the flat map under "eval/<group>/".
void put_metrics(std::map<std::string, double>& m, const std::string& group, const Summary& s,
                 const Scorer& scorer) {
  const std::string p = "eval/" + group + "/";
  m[p + "n"] = double(s.n);
  if (s.n == 0) return;
  if (scorer.enabled("cer") && s.cer) m[p + "cer"] = *s.cer;
  if (scorer.enabled("wer") && s.wer) m[p + "wer"] = *s.wer;
  if (scorer.enabled("ned")) m[p + "ned"] = s.ned;
  if (scorer.enabled("em")) m[p + "em"] = s.em;
  if (scorer.enabled("anls")) m[p + "anls"] = s.anls;
  if (scorer.enabled("ocrbench")) m[p + "ocrbench"] = s.ocrbench;
}

void write_text(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    VLM_CHECK(out, "evaluate: cannot write '", tmp.string(), "' (hint: is the output folder writable?)");
    out << text;
    out.flush();
    VLM_CHECK(out.good(), "evaluate: write failed for '", tmp.string(), "' (disk full?)");
  }
  fs::rename(tmp, path);
}

// ---------------------------------------------------------------- select

// The samples of one evaluation: every rank computes the same list.
struct EvalPlan {
  std::vector<Item> items;                          // global order: set by set
  std::vector<std::vector<std::string>> references;  // per item, non-empty
  std::vector<int64_t> local;                       // this rank's items: rank, rank + world, ...
  int64_t batches = 0;                              // this rank's generate calls (lockstep: every rank's)
  int64_t size() const { return static_cast<int64_t>(items.size()); }
};

void check_eval_inputs(const vlm::VisionLanguageModelImpl& model, const vlm::Tokenizer& tok,
                       const std::vector<EvalDataset>& datasets, const EvalOptions& opts) {
  VLM_CHECK(opts.batch_size >= 1, "evaluate: batch_size must be >= 1, got ", opts.batch_size);
  VLM_CHECK(opts.max_new_tokens >= 1, "evaluate: max_new_tokens must be >= 1, got ",
            opts.max_new_tokens);
  VLM_CHECK(opts.max_samples >= 0, "evaluate: max_samples must be >= 0, got ", opts.max_samples);
  VLM_CHECK(!datasets.empty(), "evaluate: no eval dataset (hint: set data.eval or pass --data)");
  const int64_t image_pad = tok.special_id("<|image_pad|>", "image prompts");
  VLM_CHECK(image_pad == model.cfg.image_token_id, "evaluate: the model's <|image_pad|> id is ",
            model.cfg.image_token_id, " but tokenizer ", tok.source(), " has it at ", image_pad,
            " (hint: load the model with its own tokenizer; presets take the ids from the "
            "tokenizer, see app/config/model_source.h)");
}

// The first max_samples records of each set, in set order, with their references (a record
// with nothing to score against fails before any generation), dealt round-robin to ranks.
EvalPlan select_samples(const std::vector<EvalDataset>& datasets, const EvalOptions& opts, int rank, int world) {
  EvalPlan plan;
  for (size_t s = 0; s < datasets.size(); ++s) {
    const size_t n = datasets[s].records.size();
    const size_t take = opts.max_samples > 0 ? std::min<size_t>(n, size_t(opts.max_samples)) : n;
    for (size_t r = 0; r < take; ++r) plan.items.push_back({s, r});
  }
  const int64_t n_total = plan.size();
  VLM_CHECK(n_total > 0, "evaluate: the eval datasets hold no record");
  for (const Item& it : plan.items) {
    const Record& rec = datasets[it.set].records[it.record];
    plan.references.push_back(vlm::data::generation_references(rec));
    VLM_CHECK(!plan.references.back().empty(), rec.location(), ": no reference answer to score "
              "against (expected \"text\", \"answers\" or an assistant turn after the prompt)");
  }
  for (int64_t g = rank; g < n_total; g += world) plan.local.push_back(g);
  const int64_t max_local = (n_total + world - 1) / world;
  plan.batches = opts.lockstep ? (max_local + opts.batch_size - 1) / opts.batch_size
                               : (int64_t(plan.local.size()) + opts.batch_size - 1) / opts.batch_size;
  return plan;
}

// ---------------------------------------------------------------- generate

// Decoding settings: the resolved generation config, stopping at its eos ids and at the
// tokenizer's end tokens; lockstep runs the dummy image on filler batches.
vlm::GenerationOptions generation_options(const EvalOptions& opts, const vlm::Tokenizer& tok,
                                          const vlm::VlmConfig& cfg) {
  vlm::GenerationOptions gen = vlm::to_options(opts.generation.config);
  gen.max_new_tokens = opts.max_new_tokens;
  std::vector<int64_t> stops = opts.generation.config.eos_token_ids;
  for (int64_t id : stop_tokens(tok, cfg))
    if (std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
  gen.stop_tokens = stops;
  gen.pad_token_id = opts.generation.config.pad_token_id.value_or(
      tok.specials().pad.value_or(gen.stop_tokens.front()));
  gen.seed = opts.generation.seed;
  gen.dummy_vision = opts.lockstep;
  return gen;
}

// rows: the prompts of one batch (none: a filler batch, lockstep only) -> a left-padded
// batch on the model's device (pixels in its parameter dtype).
vlm::Batch device_prompt_batch(const std::vector<const vlm::TokenizedSample*>& rows, int64_t pad_token_id,
                               const torch::Tensor& param) {
  vlm::Batch batch = rows.empty() ? vlm::collate::filler_prompt_batch(pad_token_id)
                                  : vlm::collate::left_padded_prompt_batch(rows, pad_token_id);
  const torch::Device device = param.device();
  batch.input_ids = batch.input_ids.to(device);
  batch.attention_mask = batch.attention_mask.to(device);
  if (batch.pixel_values.defined()) batch.pixel_values = batch.pixel_values.to(device, param.scalar_type());
  if (batch.image_grid_thw.defined()) batch.image_grid_thw = batch.image_grid_thw.to(device);
  return batch;
}

using LocalOutcomes = std::vector<std::pair<int64_t, Outcome>>;  // (global index, outcome)

// This rank's outcomes: prompts built by loader threads ahead of generation, `plan.batches`
// generate calls (in lockstep, a rank out of samples runs filler batches and every decode
// step agrees on stopping over `comm`, so ranks issue the same collectives).
LocalOutcomes generate_rank(vlm::VisionLanguageModelImpl& model, const vlm::Tokenizer& tok, const Recipe& recipe,
                            const std::vector<EvalDataset>& datasets, const EvalPlan& plan, const EvalOptions& opts,
                            vlm::GenerationOptions gen, vlm::sharding::Comm* comm,
                            std::chrono::steady_clock::time_point t0) {
  const int rank = comm ? comm->rank() : 0;
  const bool multi = comm && comm->world_size() > 1;
  // The model's processor and default system turn (app/config/data_options.h).
  const vlm::data::PixelConfig pixels = pixel_config(recipe, model.cfg);
  const vlm::data::SampleOptions sample_opts = sample_options(recipe, model.cfg);
  auto produce = [&](int64_t g) {
    Prepared p;
    p.global = g;
    const Record& rec = datasets[plan.items[size_t(g)].set].records[plan.items[size_t(g)].record];
    try {
      vlm::data::RecordImages images = vlm::data::load_record_images(rec, pixels);
      p.sample = vlm::data::build_generation_prompt(tok, rec, images, sample_opts, g).sample;
    } catch (const std::exception& e) {
      p.error = e.what();
    }
    return p;
  };
  vlm::data::OrderedLoader<Prepared> loader(plan.local, produce,
                                            {opts.loader_workers, std::max<int64_t>(2, opts.batch_size * 2)});
  const torch::Tensor param = model.parameters().front();

  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  LocalOutcomes results;
  ProgressBar progress({"eval", "batches", plan.batches, opts.progress && rank == 0});
  int64_t done_samples = 0;
  try {
    for (int64_t k = 0; k < plan.batches; ++k) {
      std::vector<Prepared> prepared;
      for (int64_t i = 0; i < opts.batch_size; ++i) {
        std::optional<Prepared> p = loader.next();
        if (!p) break;
        prepared.push_back(std::move(*p));
      }
      std::vector<const vlm::TokenizedSample*> rows;
      std::vector<int64_t> row_global;
      for (const Prepared& p : prepared) {
        if (p.error.empty()) {
          rows.push_back(&p.sample);
          row_global.push_back(p.global);
          continue;
        }
        Outcome o;
        o.error = p.error;
        o.present = true;
        results.push_back({p.global, std::move(o)});
      }
      if (rows.empty() && !opts.lockstep) continue;
      const bool filler = rows.empty();
      vlm::Batch batch = device_prompt_batch(rows, gen.pad_token_id, param);
      if (opts.lockstep && multi) {
        gen.stop_together = [&, filler, k](bool stopped_here) {
          // 1 while this rank still decodes; max over ranks = 0 once every rank is done.
          torch::Tensor busy = torch::tensor({(filler || stopped_here) ? 0.0f : 1.0f});
          comm->all_reduce(busy, vlm::sharding::ReduceOp::kMax, vlm::str("eval: batch ", k, " stop check"));
          return busy.item<float>() == 0.0f;
        };
      }
      vlm::GenerationOutput out = vlm::generate(model, batch, gen);
      for (size_t i = 0; i < rows.size(); ++i) {
        Outcome o;
        o.present = true;
        o.generated_tokens = static_cast<int64_t>(out.tokens[i].size());
        o.prediction = decode_answer(tok, out.tokens[i], gen.stop_tokens);
        results.push_back({row_global[i], std::move(o)});
      }
      done_samples += static_cast<int64_t>(prepared.size());
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      progress.update(k + 1, vlm::str(done_samples, " samples, ", static_cast<int64_t>(done_samples / std::max(secs, 1e-9)),
                                      " samples/s (rank 0)"));
    }
  } catch (...) {
    model.train(was_training);
    throw;
  }
  model.train(was_training);
  return results;
}

// ---------------------------------------------------------------- gather

// Every rank gets every outcome, placed at its global index; `seconds` becomes the slowest
// rank's time.
std::vector<Outcome> gather_outcomes(vlm::sharding::Comm* comm, const LocalOutcomes& results, int64_t n_total,
                                     double* seconds) {
  std::vector<Outcome> outcomes(static_cast<size_t>(n_total));
  nlohmann::json mine = {{"seconds", *seconds}, {"results", nlohmann::json::array()}};
  for (auto& [g, o] : results) mine["results"].push_back({g, o.prediction, o.generated_tokens, o.error});
  std::vector<std::string> parts;
  const std::string text = mine.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (comm && comm->world_size() > 1) parts = all_gather_strings(*comm, text);
  else parts.push_back(text);
  for (const std::string& part : parts) {
    const nlohmann::json j = nlohmann::json::parse(part);
    *seconds = std::max(*seconds, j.at("seconds").get<double>());
    for (const auto& r : j.at("results")) {
      const int64_t g = r.at(0).get<int64_t>();
      VLM_ASSERT(g >= 0 && g < n_total && !outcomes[size_t(g)].present, "sample ", g);
      Outcome& o = outcomes[size_t(g)];
      o.present = true;
      o.prediction = r.at(1).get<std::string>();
      o.generated_tokens = r.at(2).get<int64_t>();
      o.error = r.at(3).get<std::string>();
    }
  }
  for (int64_t g = 0; g < n_total; ++g) VLM_ASSERT(outcomes[size_t(g)].present, "no rank reported sample ", g);
  return outcomes;
}

// ---------------------------------------------------------------- score

// The scores of every outcome, in world-1 order, overall and per set.
struct Scored {
  explicit Scored(const ScoreOptions& o, size_t sets) : overall(o), per_set(sets, Scorer(o)), skipped_per_set(sets, 0) {}
  Scorer overall;
  std::vector<Scorer> per_set;
  std::vector<int64_t> skipped_per_set;
  nlohmann::json skipped_list = nlohmann::json::array();  // {id, dataset, reason}
  std::string predictions;                                // predictions.jsonl (rank 0, with an output dir)
  int64_t total_tokens = 0;                               // generated by the scored samples
};

Scored score_outcomes(const std::vector<EvalDataset>& datasets, const EvalPlan& plan,
                      const std::vector<Outcome>& outcomes, const EvalOptions& opts, bool write_predictions) {
  Scored sc(opts.score, datasets.size());
  for (int64_t g = 0; g < plan.size(); ++g) {
    const Item& it = plan.items[size_t(g)];
    const EvalDataset& set = datasets[it.set];
    const Record& rec = set.records[it.record];
    const Outcome& o = outcomes[size_t(g)];
    if (!o.error.empty()) {
      ++sc.skipped_per_set[it.set];
      sc.skipped_list.push_back({{"id", rec.location()}, {"dataset", set.name}, {"reason", o.error}});
      continue;
    }
    sc.total_tokens += o.generated_tokens;
    const std::vector<std::string>& refs = plan.references[size_t(g)];
    const SampleScores s = sc.overall.add(o.prediction, refs);
    sc.per_set[it.set].add(s);
    if (write_predictions) {
      nlohmann::json line = {{"id", rec.location()},
                             {"dataset", set.name},
                             {"index", it.record},
                             {"prompt", prompt_text(rec)},
                             {"prediction", o.prediction},
                             {"answers", refs},
                             {"generated_tokens", o.generated_tokens},
                             {"scores", scores_json(s, sc.overall)}};
      sc.predictions += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
  }
  return sc;
}

// Too many skipped samples in a set: the same error on every rank.
void check_skipped(const std::vector<EvalDataset>& datasets, const Scored& sc, const EvalOptions& opts) {
  for (size_t s = 0; s < datasets.size(); ++s) {
    const int64_t bad = sc.skipped_per_set[s] + datasets[s].bad_at_load;
    const int64_t lines = static_cast<int64_t>(datasets[s].records.size()) + datasets[s].bad_at_load;
    if (bad == 0) continue;
    const double frac = lines > 0 ? double(bad) / double(lines) : 1.0;
    std::string first;
    for (const auto& e : sc.skipped_list)
      if (e["dataset"] == datasets[s].name) {
        first = e["id"].get<std::string>() + ": " + e["reason"].get<std::string>();
        break;
      }
    VLM_CHECK(frac <= opts.max_bad_fraction, "eval set '", datasets[s].name, "': ", bad,
              " bad samples of ", lines, " (", sc.skipped_per_set[s], " failed while preparing the "
              "prompt, ", datasets[s].bad_at_load, " at load) exceed data.max_bad_fraction = ",
              opts.max_bad_fraction, first.empty() ? "" : "; first: " + first,
              " (hint: fix the data or raise data.max_bad_fraction)");
  }
}

// The summary: flat metrics (eval/<set>/<metric>) and eval_summary.json's object.
EvalSummary summarize(const std::vector<EvalDataset>& datasets, const Scored& sc, const EvalOptions& opts,
                      const vlm::GenerationOptions& gen, int world, int64_t n_total, double seconds) {
  EvalSummary sum;
  sum.seconds = seconds;
  sum.samples = static_cast<int64_t>(sc.overall.size());
  sum.skipped = static_cast<int64_t>(sc.skipped_list.size());
  nlohmann::json sets = nlohmann::json::object();
  for (size_t s = 0; s < datasets.size(); ++s) {
    nlohmann::json j = summary_json(sc.per_set[s].summary(), opts.score);
    j["skipped"] = sc.skipped_per_set[s];
    j["bad_at_load"] = datasets[s].bad_at_load;
    sets[datasets[s].name] = j;
    put_metrics(sum.metrics, datasets[s].name, sc.per_set[s].summary(), sc.overall);
    sum.metrics["eval/" + datasets[s].name + "/skipped"] = double(sc.skipped_per_set[s]);
  }
  put_metrics(sum.metrics, "overall", sc.overall.summary(), sc.overall);
  sum.metrics["eval/seconds"] = seconds;
  sum.metrics["eval/samples_per_s"] = seconds > 0 ? double(n_total) / seconds : 0.0;
  nlohmann::json overall_j = summary_json(sc.overall.summary(), opts.score);
  overall_j["skipped"] = sum.skipped;
  sum.json = {{"metrics", opts.score.metrics},
              {"normalization", opts.score.norm.to_json()},
              {"overall", overall_j},
              {"datasets", sets},
              {"skipped", sc.skipped_list},
              {"model", opts.model_source},
              {"checkpoint", opts.checkpoint.empty() ? nlohmann::json() : nlohmann::json(opts.checkpoint)},
              {"step", opts.step >= 0 ? nlohmann::json(opts.step) : nlohmann::json()},
              {"world_size", world},
              {"lockstep", opts.lockstep},
              {"batch_size", opts.batch_size},
              {"max_new_tokens", opts.max_new_tokens},
              {"max_samples", opts.max_samples},
              {"samples", n_total},
              {"generated_tokens", sc.total_tokens},
              {"seconds", seconds},
              {"samples_per_s", sum.metrics["eval/samples_per_s"]},
              {"tokens_per_s", seconds > 0 ? double(sc.total_tokens) / seconds : 0.0}};
  sum.json["generation"] = opts.generation.to_json();
  sum.json["generation"]["stop_tokens"] = gen.stop_tokens;
  return sum;
}

}  // namespace

// ---------------------------------------------------------------- evaluate

EvalSummary evaluate(vlm::VisionLanguageModelImpl& model, const vlm::Tokenizer& tok, const Recipe& recipe,
                     const std::vector<EvalDataset>& datasets, const EvalOptions& opts,
                     vlm::sharding::Comm* comm) {
  const auto t0 = std::chrono::steady_clock::now();
  const int world = comm ? comm->world_size() : 1;
  const int rank = comm ? comm->rank() : 0;
  check_eval_inputs(model, tok, datasets, opts);
  const EvalPlan plan = select_samples(datasets, opts, rank, world);
  const vlm::GenerationOptions gen = generation_options(opts, tok, model.cfg);
  if (rank == 0) spdlog::info("eval generation: {}", opts.generation.describe());

  const LocalOutcomes mine = generate_rank(model, tok, recipe, datasets, plan, opts, gen, comm, t0);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<Outcome> outcomes = gather_outcomes(comm, mine, plan.size(), &seconds);

  const bool write = rank == 0 && !opts.output_dir.empty();
  const Scored scored = score_outcomes(datasets, plan, outcomes, opts, write);
  check_skipped(datasets, scored, opts);
  EvalSummary sum = summarize(datasets, scored, opts, gen, world, plan.size(), seconds);
  if (write) {
    fs::create_directories(opts.output_dir);
    write_text(fs::path(opts.output_dir) / "predictions.jsonl", scored.predictions);
    write_text(fs::path(opts.output_dir) / "eval_summary.json",
               sum.json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
  return sum;
}

}  // namespace vlm::app
