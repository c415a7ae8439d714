// The evaluator: generation (greedy by default; settings from generation_config.json and
// the recipe, see resolve_generation) over eval datasets with an already built (possibly
// sharded) model, gathered and scored with app/eval/metrics.h. `vlmtrain eval` and the
// trainer's periodic eval both call evaluate().
//
//   std::vector<EvalDataset> sets = load_eval_datasets(recipe, recipe.data.eval);
//   EvalOptions o = eval_options(recipe);             // [eval] section
//   o.max_samples = recipe.eval.max_samples;          // periodic eval: a prefix per set
//   o.lockstep = dims.distributed();                  // sharded model: same unit calls
//   o.output_dir = run_dir + "/eval/step-200";        // "" = write nothing
//   EvalSummary s = evaluate(*model, *tok, recipe, sets, o, &dims.control());
//   for (auto& [k, v] : s.metrics) log(k, v);         // "eval/val/cer" -> 0.12
//
// Work split (N ranks, n samples = the first max_samples records of each set, in set order):
// rank r takes global samples r, r+N, r+2N, ... (strided, so shard sizes differ by at most
// one) and generates them in batches of batch_size in that order. Results travel with their
// global index and are all-gathered, so every rank ends with all n predictions in the
// world-1 order and computes the same summary.
//
// Lockstep (a sharded model issues collectives inside every forward, so every rank must
// make the same calls): every rank runs ceil(ceil(n / N) / batch_size) batches (a rank
// with no sample left runs a one-token filler prompt and discards it), every prompt
// without an image runs the dummy image, and decoding stops at the first step at which
// every rank's batch has stopped (one all-reduce per step).
//
// Images that fail to decode (or prompts that fail to build) are skipped and reported with
// the record's file:line and the reason; when skipped + bad-at-load records exceed
// max_bad_fraction of a set, evaluate() throws on every rank (after the gather, so no rank
// hangs).
//
// Outputs (rank 0, when output_dir is set):
//   predictions.jsonl   one line per scored sample, in world-1 order:
//     {"id": "<file>:<line>", "dataset", "index" (in the set), "prompt" (the last user turn),
//      "prediction", "answers" (the references: first = the page-OCR ground truth),
//      "generated_tokens", "scores": {enabled per-sample metrics + edit counts}}
//     `vlmtrain score --pred predictions.jsonl` reads it as is and gives the same numbers.
//   eval_summary.json   {"metrics", "normalization", "overall", "datasets": {name: {...}},
//     "skipped": [{"id", "dataset", "reason"}], "model", "checkpoint", "step", "world_size",
//     "batch_size", "max_new_tokens", "max_samples", "samples", "generated_tokens",
//     "seconds", "samples_per_s", "tokens_per_s", "generation": EvalGeneration::to_json()
//     with "stop_tokens" (the ids generation stopped at: eos ids of the settings plus the
//     tokenizer's <|im_end|> / <|endoftext|> / eos)}
//
// The model's train/eval mode is restored and no gradient is recorded (NoGradGuard): a
// periodic eval leaves training state untouched.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "app/eval/metrics.h"
#include "app/config/recipe.h"
#include "data/dataset.h"
#include "vlm/model/generation.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/text/tokenizer.h"

namespace vlm::sharding {
class Comm;
}

namespace vlm::app {

struct EvalDataset {
  std::string name;                            // key in the summary, e.g. "val"
  std::vector<vlm::data::Record> records;
  int64_t bad_at_load = 0;                     // records load_dataset skipped (bad fraction)
};

// One JSONL file per set, named after the file stem ("val" for data/val.jsonl; a repeated
// stem gets "_2", "_3"), loaded with the recipe's [data] settings (format, image_root,
// prompt, max_bad_fraction). Every rank may call it (no collectives).
std::vector<EvalDataset> load_eval_datasets(const Recipe& recipe,
                                            const std::vector<std::string>& jsonl_files);

// The generation settings eval uses, and where each came from.
struct EvalGeneration {
  vlm::GenerationConfig config;               // do_sample, temperature, top_k, top_p, penalty, eos, pad
  std::map<std::string, std::string> origin;  // key -> "recipe" | "<model>/generation_config.json" | "default"
  uint64_t seed = 0;                          // sampling stream (eval.seed)

  // {"do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "eos_token_id",
  //  "pad_token_id", "seed", "origin": {key: where}} (written to eval_summary.json).
  nlohmann::json to_json() const;
  // One line for the log: "greedy, repetition_penalty 1.05 (generation_config.json), ...".
  std::string describe() const;
};

// Precedence per key: eval.<key> of the recipe (or --set) > <model_dir>/generation_config.json
// (model_dir "" or no file: skipped) > HF's GenerationConfig defaults.
EvalGeneration resolve_generation(const EvalSection& eval, const std::string& model_dir);

struct EvalOptions {
  int64_t max_samples = 0;        // per set: the first N records; 0 = all
  int64_t batch_size = 8;         // prompts per generate() call on each rank
  int64_t max_new_tokens = 64;    // per prompt, stop token included
  ScoreOptions score;             // metrics and normalisation
  std::string output_dir;         // "" = write nothing; else created by rank 0
  bool progress = false;          // rank 0 prints progress to stderr (a bar on a TTY)
  bool lockstep = false;          // same forward calls on every rank (required when sharded)
  double max_bad_fraction = 0.01; // skipped / (records + bad_at_load) per set above this: error
  int64_t loader_workers = 2;     // image decode threads per rank
  std::string model_source;       // echoed as "model" in eval_summary.json
  std::string checkpoint;         // echoed as "checkpoint" ("" = none)
  int64_t step = -1;              // training step echoed as "step" (-1 = none)
  EvalGeneration generation;      // decoding settings (eval_options: resolve_generation)
};

// [eval] + [data] of the recipe: batch_size, max_new_tokens, metrics, normalisation,
// max_bad_fraction, loader workers, generation settings (resolve_generation with
// model.path: the generation_config.json of the model being trained or evaluated); max_samples 0 (all: what `vlmtrain eval` does;
// the trainer sets recipe.eval.max_samples for periodic evals).
EvalOptions eval_options(const Recipe& recipe);

struct EvalSummary {
  // Flat numbers for the trainer's log, identical on every rank:
  //   "eval/<set>/<metric>" and "eval/overall/<metric>" for every enabled metric (cer / wer
  //   absent when the references have no characters / words), "eval/<set>/n",
  //   "eval/<set>/skipped", "eval/overall/n", "eval/seconds", "eval/samples_per_s".
  std::map<std::string, double> metrics;
  nlohmann::json json;             // eval_summary.json (on every rank)
  int64_t samples = 0;             // scored samples, all sets
  int64_t skipped = 0;
  double seconds = 0;              // wall time of the slowest rank
};

// Collective when comm has world size > 1: every rank calls it with the same datasets and
// options (comm == nullptr or world size 1: single process). Returns the same summary on
// every rank. Throws vlm::Error for bad input (empty sets, a model and tokenizer that
// disagree on special ids) and for too many skipped samples.
EvalSummary evaluate(vlm::VisionLanguageModelImpl& model, const vlm::Tokenizer& tok, const Recipe& recipe,
                     const std::vector<EvalDataset>& datasets, const EvalOptions& opts,
                     vlm::sharding::Comm* comm = nullptr);

}  // namespace vlm::app
