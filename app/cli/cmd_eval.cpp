// `vlmtrain eval`: evaluate an HF model (or the recipe's model) on OCR sets.
//
// Builds the model on every rank (no sharding: each rank holds the whole model and
// generates its share of the samples; see app/eval/evaluator.h), then rank 0 writes
// predictions.jsonl and eval_summary.json.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "app/train/checkpoint.h"
#include "app/cli/commands.h"
#include "app/eval/evaluator.h"
#include "app/report/logging.h"
#include "app/config/lora_model.h"
#include "app/config/model_source.h"
#include "app/config/sharding_options.h"
#include "sharding/dist/comm.h"
#include "sharding/dist/parallel_dims.h"
#include "vlm/runtime/check.h"
#include "vlm/model/meta_init.h"
#include "vlm/io/peft_adapter.h"

namespace vlm::app {

namespace {

// A training checkpoint (step-<N>/, or a run directory: its newest complete one) as a
// model: config.json of the checkpoint, the consolidated parameters, and the tokenizer the
// run trained with (model.tokenizer of the recipe when set).
LoadedModel load_checkpoint_model(const std::string& path, const Recipe& recipe, const LoadModelOptions& opts) {
  namespace fs = std::filesystem;
  std::string dir = path;
  if (!fs::exists(fs::path(dir) / "trainer.json")) {
    auto all = complete_checkpoints(dir);
    VLM_CHECK(!all.empty(), "vlmtrain eval: --checkpoint ", dir, " is neither a checkpoint nor a run directory "
              "with a complete checkpoint (expected step-<N>/ with trainer.json and COMPLETE)");
    dir = all.back();
  }
  CheckpointReader ck(dir);
  if (is_lora_checkpoint(ck)) return load_lora_checkpoint(ck, recipe.model, opts, recipe.source);
  LoadedModel lm;
  const std::string tok = !recipe.model.tokenizer.empty() ? recipe.model.tokenizer : ck.tokenizer_path();
  lm.tokenizer = vlm::load_tokenizer(tok);
  vlm::VlmConfig cfg = vlm::parse_hf_config(ck.config_json(), dir + "/config.json");
  check_tokenizer_special_ids(cfg, *lm.tokenizer, dir + "/config.json");
  lm.model = vlm::VisionLanguageModel(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*lm.model, {opts.device, opts.dtype, opts.seed, 0.02, /*init=*/false});
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : lm.model->named_parameters()) params[p.key()] = p.value();
  torch::NoGradGuard no_grad;
  int64_t loaded = 0;
  for (const auto& [name, t] : ck.consolidated()) {
    auto it = params.find(name);
    VLM_CHECK(it != params.end(), dir, ": parameter ", name, " is not in the model its config.json builds");
    it->second.copy_(t);
    ++loaded;
  }
  VLM_CHECK(loaded == static_cast<int64_t>(params.size()), dir, ": holds ", loaded, " of the model's ",
            params.size(), " parameters");
  lm.description = vlm::str("checkpoint ", dir, " (step ", ck.state().step, ")");
  return lm;
}

struct EvalArgs {
  RecipeArgs recipe;
  std::optional<std::string> model;       // --model HF_DIR
  std::optional<std::string> checkpoint;  // --checkpoint DIR
  std::optional<std::string> adapter;     // --adapter PEFT_DIR
  std::vector<std::string> data;          // --data FILE.jsonl (repeatable)
  std::optional<long long> max_new_tokens, batch_size, max_samples;
  std::optional<std::string> out;         // --out DIR
};

int eval(const EvalArgs& a) {
  Recipe recipe = load_recipe(a.recipe);
  const auto& model_dir = a.model;
  const auto& checkpoint = a.checkpoint;
  const auto& adapter = a.adapter;
  const std::vector<std::string>& data = a.data;
  const auto& max_new = a.max_new_tokens;
  const auto& batch = a.batch_size;
  const auto& max_samples = a.max_samples;
  const auto& out_dir = a.out;
  VLM_CHECK(!(model_dir && checkpoint), "vlmtrain eval: give --model or --checkpoint, not both");
  VLM_CHECK(!(adapter && checkpoint), "vlmtrain eval: give --adapter or --checkpoint, not both (a LoRA checkpoint "
            "goes on the recipe's model by itself)");
  if (model_dir) {
    namespace fs = std::filesystem;
    VLM_CHECK(fs::is_directory(*model_dir), "vlmtrain eval: --model '", *model_dir,
              "' is not a directory (expected an HF model directory with config.json)");
    recipe.model.preset.clear();
    recipe.model.path = *model_dir;
    const bool has_tokenizer = fs::exists(fs::path(*model_dir) / "tokenizer.json") ||
                               fs::exists(fs::path(*model_dir) / "tokenizer.model");
    if (has_tokenizer) recipe.model.tokenizer.clear();  // the model's own tokenizer
  }
  if (!data.empty()) recipe.data.eval = data;
  recipe.validate(Purpose::eval);

  EvalOptions opts = eval_options(recipe);
  if (max_new) {
    VLM_CHECK(*max_new >= 1, "vlmtrain eval: --max-new-tokens must be >= 1, got ", *max_new);
    opts.max_new_tokens = *max_new;
  }
  if (batch) {
    VLM_CHECK(*batch >= 1, "vlmtrain eval: --batch-size must be >= 1, got ", *batch);
    opts.batch_size = *batch;
  }
  if (max_samples) {
    VLM_CHECK(*max_samples >= 0, "vlmtrain eval: --max-samples must be >= 0, got ", *max_samples);
    opts.max_samples = *max_samples;
  }
  opts.output_dir = out_dir ? *out_dir : recipe.run.output_dir + "/eval";

  namespace sh = vlm::sharding;
  sh::ParallelOptions popts = parallel_options(recipe);
  popts.mesh = false;  // eval replicates the model (no sharding policies)
  popts.tp = 1;        // and holds it whole (a tensor-parallel checkpoint is put back together)
  sh::ParallelDims dims = sh::ParallelDims::from_environment(popts);
  init_logging(dims.rank(), dims.world_size(), recipe.log.level, recipe.log.all_ranks);
  if (dims.distributed()) spdlog::info("{}", dims.env().describe());

  LoadModelOptions lopts;
  lopts.seed = static_cast<uint64_t>(recipe.run.seed);
  lopts.device = dims.device();
  lopts.dtype = recipe_dtype(recipe.precision.param_dtype);
  LoadedModel lm = checkpoint ? load_checkpoint_model(*checkpoint, recipe, lopts)
                              : load_model(recipe.model, lopts, recipe.source);
  if (adapter) {
    const vlm::PeftAdapter a = vlm::read_peft_adapter(*adapter);
    vlm::apply_peft_adapter(*lm.model, a);
    lm.description += vlm::str(" + PEFT adapter ", *adapter, " (", a.modules.size(), " modules)");
  }
  spdlog::info("model: {}", lm.description);
  if (lm.random_init)
    spdlog::warn("model.preset {} has random weights: the scores measure an untrained model "
                 "(hint: --model HF_DIR)", recipe.model.preset);
  opts.model_source = lm.description;

  std::vector<EvalDataset> sets = load_eval_datasets(recipe, recipe.data.eval);
  for (const EvalDataset& s : sets)
    spdlog::info("eval set {}: {} records ({} bad at load)", s.name, s.records.size(), s.bad_at_load);
  // Each process holds the whole model: forward calls issue no collectives, so ranks need
  // not run in lockstep.
  opts.lockstep = false;
  opts.progress = dims.is_main();

  EvalSummary sum = evaluate(*lm.model, *lm.tokenizer, recipe, sets, opts,
                             dims.distributed() ? &dims.control() : nullptr);
  if (dims.is_main()) {
    std::printf("%-24s %8s %8s", "dataset", "n", "skipped");
    for (const std::string& m : opts.score.metrics) std::printf(" %9s", m.c_str());
    std::printf("\n");
    auto row = [&](const std::string& name, const nlohmann::json& j) {
      std::printf("%-24s %8lld %8lld", name.c_str(), j["n"].get<long long>(),
                  j["skipped"].get<long long>());
      for (const std::string& m : opts.score.metrics) {
        if (j["n"].get<long long>() == 0 || j[m].is_null()) std::printf(" %9s", "n/a");
        else std::printf(" %9.4f", j[m].get<double>());
      }
      std::printf("\n");
    };
    for (const auto& [name, j] : sum.json["datasets"].items()) row(name, j);
    row("overall", sum.json["overall"]);
    std::printf("%lld samples in %.1f s (%.2f samples/s, %d process%s)\nwrote %s/predictions.jsonl "
                "and %s/eval_summary.json\n",
                static_cast<long long>(sum.json["samples"].get<int64_t>()), sum.seconds,
                sum.json["samples_per_s"].get<double>(), dims.world_size(),
                dims.world_size() == 1 ? "" : "es", opts.output_dir.c_str(), opts.output_dir.c_str());
  }
  if (dims.distributed()) dims.control().barrier("eval: done");  // rank 0 may host the store
  return 0;
}

}  // namespace

CommandRun declare_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  app.description(R"(usage: vlmtrain eval RECIPE [--model HF_DIR | --checkpoint DIR] [--adapter PEFT_DIR] [--data FILE.jsonl]...
                     [--max-new-tokens N] [--batch-size B] [--max-samples N] [--out DIR]
                     [--set KEY=VALUE]...

Generates an answer (KV cache; stops at the eos ids of the generation settings and at
<|im_end|> / <|endoftext|>) for every sample of the eval sets and scores it: CER, WER, NED, exact match, ANLS, OCRBench-style
accuracy, per set and overall (metrics and normalisation from the recipe's [eval] section,
e.g. --set eval.case_sensitive=false --set 'eval.metrics=["cer","wer"]').
)");
  add_recipe(app, a->recipe);
  add_value(app, "--model", a->model, "HF_DIR",
            "an HF directory: config.json, safetensors, and tokenizer files\n"
            "(tokenizer.json / tokenizer.model; else model.tokenizer is used)")
      ->group("model (default: the recipe's [model] section, a preset or model.path)");
  add_value(app, "--checkpoint", a->checkpoint, "DIR",
            "a training checkpoint step-<N>/ (or a run directory: its newest);\n"
            "a LoRA checkpoint goes on top of the recipe's [model] (its base)")
      ->group("model (default: the recipe's [model] section, a preset or model.path)");
  add_value(app, "--adapter", a->adapter, "PEFT_DIR",
            "a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors,\n"
            "e.g. from `vlmtrain export` or peft's save_pretrained) applied on\n"
            "top of the model (the recipe's or --model)")
      ->group("model (default: the recipe's [model] section, a preset or model.path)");
  const std::string data_group = "data (default: data.eval of the recipe; one set per file, named after the file stem)";
  add_value(app, "--data", a->data, "FILE.jsonl", "an eval set (repeatable); replaces data.eval")->group(data_group);
  add_value(app, "--max-samples", a->max_samples, "N", "only the first N records of each set (default 0 = all)")
      ->group(data_group);
  add_value(app, "--max-new-tokens", a->max_new_tokens, "N", "default eval.max_new_tokens")->group("generation");
  add_value(app, "--batch-size", a->batch_size, "B", "prompts per batch on each process (default eval.batch_size)")
      ->group("generation");
  add_value(app, "--out", a->out, "DIR", "default <run.output_dir>/eval")->group("output (written by rank 0)");
  app.footer(R"(decoding: each of eval.do_sample, eval.temperature, eval.top_k, eval.top_p,
eval.repetition_penalty (recipe or --set, e.g. --set eval.repetition_penalty=1.05) wins
over the model directory's generation_config.json, which wins over HF's defaults
(greedy, no penalty); eos / pad ids come from the file and the tokenizer. The resolved
settings are logged and written to eval_summary.json ("generation", with each key's origin).

output files:
  DIR/predictions.jsonl one line per sample: id (file:line), dataset, index, prompt,
                        prediction, answers (the references), generated_tokens, scores;
                        `vlmtrain score --pred DIR/predictions.jsonl` gives the same numbers
  DIR/eval_summary.json metrics per set and overall, normalisation, skipped samples,
                        model, generation settings, seconds, samples/s

Runs under torchrun / srun / `vlmtrain launch`: every process loads the model and
generates a strided share of the samples; results are gathered on rank 0. A progress bar
is drawn on a terminal, plain lines otherwise. Records whose image cannot be decoded are
reported (file:line and reason) and skipped, up to data.max_bad_fraction of a set.)");
  return [a] { return eval(*a); };
}

}  // namespace vlm::app
