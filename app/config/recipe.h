// The recipe: everything a run needs, as plain typed structs with defaults.
//
// One field list per struct (its `fields()` member) drives parsing, printing, the
// unknown-key check and the key reference (docs/recipe.md, `vlmtrain recipe --doc`), so a
// key is named, constrained and documented in exactly one place: each entry is
//   v("key", member, [Choice{...} | Range{...},] "doc")
// where the doc is one line of markdown (a nested section's entry documents the section).
// Parsing (app/config/recipe.cpp) reports every error as
// `file:line: key: what is wrong (expected ..., got ...)`.
//
//   Recipe r = load_recipe("recipes/ocr_tiny.toml", {"optim.lr=2e-5"});
//   r.validate(Purpose::train);          // cross-field checks, same error format
//   std::cout << to_toml(r);             // the resolved recipe
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace vlm::app {

// Allowed values of a string field (an enum spelled as in the TOML file).
struct Choice {
  std::vector<std::string> values;
};

// model.family's values: "" and every registered family's model_type (vlm::family_names()).
std::vector<std::string> family_choices();
// Inclusive numeric bounds; `lo_open` makes the lower bound exclusive (e.g. lr > 0).
struct Range {
  double lo;
  double hi;
  bool lo_open = false;
};

struct RunSection {
  std::string name;
  std::string output_dir = "runs/run";
  int64_t seed = 0;

  template <class V> void fields(V& v) {
    v("name", name, "run name; \"\" = the recipe file's stem");
    v("output_dir", output_dir, "where checkpoints, metrics.jsonl, TensorBoard events and the resolved recipe go");
    v("seed", seed, Range{0, 9.0e18}, "model init, data order and dropout all derive from it");
  }
};

struct ModelSection {
  std::string preset;
  std::string path;
  std::string tokenizer;
  std::string family;
  bool sharded_load = true;
  double router_aux_loss_coef = 0;

  template <class V> void fields(V& v) {
    v("preset", preset, "built-in architecture, randomly initialised (`tiny`, ...; every registered family's "
                        "presets, listed by `vlmtrain plan --help`)");
    v("path", path, "HF model directory (config.json + safetensors): the weights to start from");
    v("tokenizer", tokenizer, "tokenizer.json, sentencepiece .model, or a directory holding one; \"\" = model.path");
    v("family", family, Choice{family_choices()},
      "a registered family's model_type: the architecture when there is no preset and no config.json to say it");
    v("sharded_load", sharded_load,
      "training start-up: build on the meta device and let each rank allocate and read only the parameters it "
      "keeps (an FSDP shard: its 1/N range, straight from the mmap'd safetensors); false: every rank loads the "
      "whole model and rank 0's copy is broadcast (twice the model's bytes per rank at start; kept for "
      "comparison)");
    v("router_aux_loss_coef", router_aux_loss_coef, Range{0, 1e3},
      "mixture-of-experts models: weight of the load-balancing loss (HF's load_balancing_loss_func, averaged "
      "over the step's micro-batches) added to the objective; 0 = none, as transformers with the released "
      "configs (output_router_logits false); LLaMA-Factory's moe_aux_loss_coef / ms-swift's "
      "router_aux_loss_coef, e.g. 0.001 (docs/moe.md)");
  }
};

struct SynthSection {
  bool generate_if_missing = false;
  int64_t train = 4000;
  int64_t val = 200;
  int64_t seed = 1234;
  std::string layout = "proportional";
  std::string style = "varied";
  int64_t min_height = 28;
  int64_t max_height = 56;
  std::string tokenizer = "unigram";
  int64_t vocab_size = 2048;

  template <class V> void fields(V& v) {
    v("generate_if_missing", generate_if_missing,
      "render the set into the folder of data.train[0] when it is missing, or when the synth_ocr.json there "
      "records other settings than these or an older renderer");
    v("train", train, Range{1, 1e8}, "training lines to render");
    v("val", val, Range{0, 1e8}, "validation lines to render");
    v("seed", seed, Range{0, 9.0e18}, "rendering seed (independent of run.seed)");
    v("layout", layout, Choice{{"proportional", "grid"}},
      "`grid` puts character i in cell i of a fixed canvas (see `vlmtrain synth-ocr --help`)");
    v("style", style, Choice{{"varied", "clean"}},
      "`clean`: two upright sans fonts, dark on light; `varied`: four fonts, italics, inverted colours, blur, "
      "rotation");
    v("min_height", min_height, Range{8, 4096}, "smallest line height in pixels");
    v("max_height", max_height, Range{8, 4096}, "largest line height in pixels (the grid layout's height)");
    v("tokenizer", tokenizer, Choice{{"unigram", "char"}},
      "sentencepiece model type trained on the rendered text (`char`: one piece per character)");
    v("vocab_size", vocab_size, Range{64, 1e6}, "unigram vocabulary target");
  }
};

struct DataSection {
  std::vector<std::string> train;
  std::vector<std::string> eval;
  std::string format = "auto";
  std::string image_root;
  std::string prompt = "Read the text in the image.";
  std::string system_prompt;
  int64_t max_image_tokens = 1024;
  int64_t min_pixels = 0;
  int64_t max_pixels = 0;
  int64_t max_seq_len = 2048;
  double max_bad_fraction = 0.01;
  int64_t num_workers = 2;
  int64_t prefetch = 4;
  bool shuffle = true;
  bool group_by_length = false;
  SynthSection synth;

  template <class V> void fields(V& v) {
    v("train", train,
      "dataset entries (a single string is accepted): JSONL files, JSON-array files (read streaming), or "
      "LLaMA-Factory datasets as `path/to/dataset_info.json#name` (or `folder#name`); see docs/data.md");
    v("eval", eval, "the same kinds of entries, scored by `vlmtrain eval` and the periodic eval");
    v("format", format, Choice{{"auto", "messages", "llava", "ocr", "sharegpt", "alpaca", "swift"}},
      "record format of every plain file (`auto`: detected per file from its first record); dataset_info.json "
      "entries use their own `formatting`");
    v("image_root", image_root,
      "base of relative image paths; \"\" = the dataset file's folder (dataset_info.json entries: its folder, "
      "LLaMA-Factory's media_dir)");
    v("prompt", prompt, "the user turn of plain OCR records");
    v("system_prompt", system_prompt,
      "\"\" = the model family's default system turn (its registry entry's; some families have none); `none` = "
      "no system turn; anything else = that text");
    v("max_image_tokens", max_image_tokens, Range{1, 1e7},
      "cap per image in merged tokens: max_pixels = cap x factor^2, factor = the model's patch x merge "
      "(vision_config: 14 x 2 = 28, or 16 x 2 = 32)");
    v("min_pixels", min_pixels, Range{0, 1e10},
      "smart_resize lower bound in pixels; 0 = the model's (its preprocessor_config.json, else its family's "
      "registry defaults, e.g. 3136)");
    v("max_pixels", max_pixels, Range{0, 1e10},
      "smart_resize upper bound in pixels; 0 = the model's (as min_pixels; e.g. 12845056)");
    v("max_seq_len", max_seq_len, Range{16, 1e7}, "longer samples are truncated (never inside an image)");
    v("max_bad_fraction", max_bad_fraction, Range{0, 1}, "more unusable records than this fraction is an error");
    v("num_workers", num_workers, Range{0, 256}, "loader threads per rank (0: load on the training thread)");
    v("prefetch", prefetch, Range{1, 1024}, "micro-batches prepared ahead per rank");
    v("shuffle", shuffle, "reshuffle every epoch (seeded)");
    v("group_by_length", group_by_length, "batch samples of similar token cost together");
    v("synth", synth, "Synthetic OCR data rendered on first use (the tiny default needs no downloads).");
  }
};

struct BatchSection {
  int64_t samples_per_rank = 8;
  int64_t max_tokens = 4096;
  int64_t max_image_tokens = 4096;
  int64_t max_micro_batches = 64;
  bool packing = false;

  template <class V> void fields(V& v) {
    v("samples_per_rank", samples_per_rank, Range{1, 1e6}, "samples each rank consumes per optimizer step");
    v("max_tokens", max_tokens, Range{16, 1e9},
      "per micro-batch: padded length x rows (text + image tokens); with packing the sum of the samples' "
      "lengths");
    v("max_image_tokens", max_image_tokens, Range{1, 1e9}, "per micro-batch: merged image tokens");
    v("max_micro_batches", max_micro_batches, Range{1, 1e6}, "per step and rank; needing more is an error");
    v("packing", packing,
      "padding-free packing (docs/packing.md): whole samples back to back in one row per micro-batch, each "
      "keeping its own positions and attending only to itself");
  }
};

struct OptimGroup {
  std::string match;
  std::optional<double> lr;
  std::optional<double> weight_decay;

  template <class V> void fields(V& v) {
    v("match", match, "globs on parameter names, `|` = or, e.g. `visual.merger.*|model.embed_tokens.*`");
    v("lr", lr, Range{0, 10, true}, "the group's peak learning rate; unset = optim.lr");
    v("weight_decay", weight_decay, Range{0, 10}, "unset = optim.weight_decay");
  }
};

struct OptimSection {
  std::string name = "adamw";
  double lr = 1e-4;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip = 1.0;
  std::string no_decay = "*.bias|*norm*.weight|*ln_q.weight";
  int64_t max_bad_steps = 5;
  std::vector<OptimGroup> group;

  template <class V> void fields(V& v) {
    v("name", name, Choice{{"adamw"}}, "AdamW with fp32 masters");
    v("lr", lr, Range{0, 10, true}, "peak learning rate");
    v("weight_decay", weight_decay, Range{0, 10}, "decoupled weight decay (AdamW)");
    v("beta1", beta1, Range{0, 1}, "AdamW beta1");
    v("beta2", beta2, Range{0, 1}, "AdamW beta2");
    v("eps", eps, Range{0, 1, true}, "AdamW epsilon");
    v("grad_clip", grad_clip, Range{0, 1e6}, "clip to this global L2 gradient norm; 0 disables");
    v("no_decay", no_decay, "globs of the parameters that get no weight decay");
    v("max_bad_steps", max_bad_steps, Range{1, 1e6},
      "end the run after this many consecutive steps with a non-finite loss or gradient norm (each one is "
      "skipped on every rank)");
    v("group", group, "Per-module optimizer settings: the first group whose glob matches a parameter wins.");
  }
};

struct ScheduleSection {
  int64_t steps = 0;
  double epochs = 0;
  int64_t warmup_steps = 0;
  std::string decay = "cosine";
  double min_lr_ratio = 0.0;

  template <class V> void fields(V& v) {
    v("steps", steps, Range{0, 1e9}, "optimizer steps; 0 = derive from epochs");
    v("epochs", epochs, Range{0, 1e6}, "passes over data.train, used when steps = 0");
    v("warmup_steps", warmup_steps, Range{0, 1e9}, "linear warmup from 0");
    v("decay", decay, Choice{{"cosine", "linear", "constant"}}, "shape of the learning rate after warmup");
    v("min_lr_ratio", min_lr_ratio, Range{0, 1}, "floor of the decay, as a fraction of optim.lr");
  }
};

struct PrecisionSection {
  std::string param_dtype = "fp32";
  std::string reduce_dtype = "fp32";

  template <class V> void fields(V& v) {
    v("param_dtype", param_dtype, Choice{{"fp32", "bf16"}},
      "compute dtype of the parameters (optimizer masters are always fp32)");
    v("reduce_dtype", reduce_dtype, Choice{{"fp32", "bf16"}}, "dtype of gradient reductions");
  }
};

struct ActivationCheckpointingSection {
  std::string match;

  template <class V> void fields(V& v) {
    v("match", match, "units recomputed in backward, e.g. `model.layers.*`; \"\" = none");
  }
};

struct ShardingRule {
  std::string match;
  std::string policy;
  std::string strategy;
  std::optional<int64_t> r;
  std::optional<double> alpha;
  std::optional<double> dropout;
  std::optional<bool> rslora;
  std::optional<std::string> init;

  template <class V> void fields(V& v) {
    v("match", match, "globs on module paths, `|` = or, e.g. `visual.blocks.*|visual.patch_embed`");
    v("policy", policy, Choice{{"freeze", "ddp", "fsdp", "lora", "ep"}},
      "what the matched modules get; `ep` (expert parallelism) takes MoE experts only, e.g. match = "
      "\"*.mlp.experts\": each rank of a group of dist.ep ranks holds E / dist.ep experts of every sparse layer, "
      "tokens travel to them by all-to-all, their gradients are all-reduced over the ranks holding the same "
      "experts; the rest of each layer keeps its own rule");
    v("strategy", strategy, Choice{{"", "full_shard", "shard_grad_op", "hybrid_shard", "no_shard", "shard_optimizer"}},
      "fsdp: full_shard, shard_grad_op, hybrid_shard (full_shard within groups of dist.dp_shard ranks, "
      "replicated across them) or no_shard; ddp: \"\" or shard_optimizer; freeze and lora: \"\" or no_shard "
      "(replicated), full_shard or hybrid_shard (the frozen weights sharded, gathered for forward and "
      "backward); ep: \"\" only");
    v("r", r, Range{1, 1e6}, "lora only: adapter rank (PEFT `r`); unset = 8");
    v("alpha", alpha, Range{0, 1e9, true}, "lora only: scaling alpha / r (PEFT `lora_alpha`); unset = 16");
    v("dropout", dropout, Range{0, 0.999}, "lora only: dropout on the adapter input (PEFT `lora_dropout`); unset = 0");
    v("rslora", rslora, "lora only: scaling alpha / sqrt(r) (PEFT `use_rslora`); unset = false");
    v("init", init, Choice{{"kaiming", "gaussian"}},
      "lora only: init of A (PEFT `init_lora_weights`: True = kaiming, \"gaussian\"); B starts at 0; unset = "
      "kaiming");
  }
};

struct ShardingSection {
  std::string default_policy = "ddp";
  std::string default_strategy;
  double ddp_bucket_mb = 25;
  std::string fsdp_accumulate = "sharded";
  bool optimizer_offload = false;
  std::vector<ShardingRule> module;

  template <class V> void fields(V& v) {
    v("default", default_policy, Choice{{"freeze", "ddp", "fsdp"}}, "policy of the parameters no rule matches");
    v("default_strategy", default_strategy,
      Choice{{"", "full_shard", "shard_grad_op", "hybrid_shard", "no_shard", "shard_optimizer"}},
      "strategy of the default policy");
    v("ddp_bucket_mb", ddp_bucket_mb, Range{0.001, 1e5}, "DDP gradient bucket size in MiB");
    v("fsdp_accumulate", fsdp_accumulate, Choice{{"sharded", "unsharded"}},
      "FSDP gradient accumulation over a step's micro-batches: `sharded` reduce-scatters every micro-batch "
      "into the fp32 shard gradient; `unsharded` keeps each unit's unsharded gradient sum and reduce-scatters "
      "once per step (less traffic, more memory)");
    v("optimizer_offload", optimizer_offload,
      "ZeRO-Offload: fp32 masters and AdamW moments in (pinned) host memory, updated on the host while the "
      "next forward runs; the device keeps none");
    v("module", module,
      "The policy table, one `[[sharding.module]]` rule per entry, in file order: the first rule whose glob "
      "matches a module wins (docs/recipes.md).");
  }
};

struct DistSection {
  std::string backend = "auto";
  std::string device = "auto";
  double timeout_s = 600;
  int64_t dp_shard = 0;
  int64_t ep = 1;
  int64_t cp = 1;
  std::string cp_mode = "ulysses";
  int64_t tp = 1;
  int64_t pp = 1;

  template <class V> void fields(V& v) {
    v("backend", backend, Choice{{"auto", "gloo", "nccl"}},
      "data plane backend; `auto` = NCCL on CUDA, Gloo on CPU");
    v("device", device, Choice{{"auto", "cpu", "cuda"}}, "`auto` = CUDA when available");
    v("timeout_s", timeout_s, Range{1, 1e6}, "bound on every collective and on the rendezvous");
    v("dp_shard", dp_shard, Range{0, 1e6},
      "hybrid_shard units: ranks per shard group (mesh dp_replicate x dp_shard); 0 = the ranks of one node "
      "(LOCAL_WORLD_SIZE); must divide the world size");
    v("ep", ep, Range{1, 1e6},
      "expert parallelism: ranks per EP group (consecutive ranks) splitting each MoE layer's experts, for the "
      "`ep` sharding rules; must divide the world size and the experts per layer; 1 = none");
    v("cp", cp, Range{1, 1e6},
      "context parallelism: ranks per group (consecutive ranks) that split each sequence between them and run "
      "the same micro-batches (the data-parallel degree is world / cp); must divide the world size; 1 = none "
      "(docs/context_parallel.md)");
    v("cp_mode", cp_mode, Choice{{"ulysses", "ring"}},
      "how a split sequence attends: `ulysses` (an all-to-all around each attention gives every rank H / cp heads "
      "of the whole sequence; cp must divide the heads) or `ring` (ring attention: rank r holds chunks r and "
      "2 cp - 1 - r of 2 cp, the key/value blocks go around the ring, cp - 1 hops per attention; any head counts)");
    v("tp", tp, Range{1, 1e6},
      "tensor parallelism: ranks per group (consecutive ranks, usually one node's GPUs) that split each decoder "
      "layer's heads and MLP width and the vocabulary, with sequence-parallel norms, and run the same "
      "micro-batches (DDP / FSDP then run over the world / tp data-parallel ranks); must divide the world size, "
      "the heads, the key/value heads, intermediate_size and the vocabulary; needs model.sharded_load; not with "
      "cp, ep, hybrid_shard or LoRA yet; 1 = none (docs/tensor_parallel.md)");
    v("pp", pp, Range{1, 1e6},
      "pipeline parallelism: stages (the outermost dimension: stage s is ranks [s world/pp, (s+1) world/pp)), each "
      "holding a contiguous run of the decoder layers balanced by cost (stage 0 also the vision tower, the last "
      "the head), running each step's micro-batches in 1F1B order; data and tensor parallelism inside a stage; "
      "must divide the world size; needs model.sharded_load; not with cp, ep, hybrid_shard, LoRA or the MoE "
      "aux loss yet; 1 = none (docs/pipeline_parallel.md)");
  }
};

struct CheckpointSection {
  int64_t every = 0;
  int64_t keep_last = 2;
  std::string resume = "auto";
  bool save_final = true;
  bool async = false;

  template <class V> void fields(V& v) {
    v("every", every, Range{0, 1e9}, "steps between checkpoints; 0 = only at the end");
    v("keep_last", keep_last, Range{1, 1e6}, "older complete checkpoints are pruned");
    v("resume", resume, "`auto` (the newest complete checkpoint in run.output_dir), `none`, or a checkpoint path");
    v("save_final", save_final, "write a checkpoint after the last step");
    v("async", async, "write checkpoints on a background thread while training goes on (the state is copied to "
                      "host memory at the step; COMPLETE once every rank's files are written); false = the step "
                      "loop waits for the files");
  }
};

struct EvalSection {
  int64_t every = 0;
  int64_t max_samples = 64;
  bool at_end = true;
  int64_t max_new_tokens = 64;
  int64_t batch_size = 8;
  std::vector<std::string> metrics = {"cer", "wer", "ned", "em", "anls", "ocrbench"};
  bool case_sensitive = true;
  bool collapse_whitespace = true;
  bool strip_punctuation = false;
  bool nfc = true;
  std::optional<bool> do_sample;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<double> repetition_penalty;
  int64_t seed = 0;

  template <class V> void fields(V& v) {
    v("every", every, Range{0, 1e9}, "steps between periodic evals during training; 0 = none");
    v("max_samples", max_samples, Range{0, 1e9}, "samples per dataset in a periodic eval (0 = all)");
    v("at_end", at_end, "full eval on data.eval after training");
    v("max_new_tokens", max_new_tokens, Range{1, 1e6}, "generation length limit");
    v("batch_size", batch_size, Range{1, 1e5}, "prompts generated together (left-padded)");
    v("metrics", metrics, Choice{{"cer", "wer", "ned", "em", "anls", "ocrbench"}}, "metrics to report");
    v("case_sensitive", case_sensitive, "text normalisation before scoring (echoed in eval_summary.json)");
    v("collapse_whitespace", collapse_whitespace, "text normalisation: runs of whitespace count as one space");
    v("strip_punctuation", strip_punctuation, "text normalisation: punctuation removed");
    v("nfc", nfc, "text normalisation: Unicode NFC");
    v("do_sample", do_sample,
      "false = greedy. Each generation key left unset takes the value of model.path's generation_config.json, "
      "else HF's default; the resolved values and their origin go to eval_summary.json");
    v("temperature", temperature, Range{0, 1e6, true}, "sampling only");
    v("top_k", top_k, Range{0, 1e9}, "sampling only; 0 = off");
    v("top_p", top_p, Range{0, 1, true}, "sampling only");
    v("repetition_penalty", repetition_penalty, Range{0, 1e6, true}, "1 = off (HF's definition)");
    v("seed", seed, Range{0, 9e15}, "seed of the sampling stream");
  }
};

struct LogSection {
  int64_t every = 1;
  std::string level = "info";
  bool all_ranks = false;
  bool tensorboard = true;

  template <class V> void fields(V& v) {
    v("every", every, Range{1, 1e9}, "steps between log lines");
    v("level", level, Choice{{"trace", "debug", "info", "warn", "error"}},
      "log level (the environment variable VLMTRAIN_LOG_LEVEL wins)");
    v("all_ranks", all_ranks, "log from every rank, not only rank 0");
    v("tensorboard", tensorboard, "TensorBoard event files under <run.output_dir>/tb/ (written by rank 0)");
  }
};

enum class Purpose { train, eval, plan };

struct Recipe {
  RunSection run;
  ModelSection model;
  DataSection data;
  BatchSection batch;
  OptimSection optim;
  ScheduleSection schedule;
  PrecisionSection precision;
  ActivationCheckpointingSection activation_checkpointing;
  ShardingSection sharding;
  DistSection dist;
  CheckpointSection checkpoint;
  EvalSection eval;
  LogSection log;

  std::string source;                          // recipe file path as given
  std::map<std::string, std::string> where;    // dotted key -> "file:line" (for errors)

  template <class V> void fields(V& v) {
    v("run", run, "The run's name, output folder and seed.");
    v("model", model, "Which model to train: a built-in preset (random init) or an HF directory.");
    v("data", data, "Datasets, their record format, image budgets and the loader.");
    v("batch", batch, "How many samples a step takes and how they are cut into micro-batches.");
    v("optim", optim, "The optimizer (AdamW, fp32 masters) and gradient clipping.");
    v("schedule", schedule, "Run length and learning-rate schedule.");
    v("precision", precision, "Mixed precision, with FSDP's MixedPrecision meaning.");
    v("activation_checkpointing", activation_checkpointing,
      "Units whose activations are recomputed in backward instead of kept.");
    v("sharding", sharding, "The sharding policy table and the engines' settings (docs/recipes.md).");
    v("dist", dist, "Processes, devices and collectives.");
    v("checkpoint", checkpoint, "Training checkpoints and resume (docs/checkpoints.md).");
    v("eval", eval, "Evaluation during and after training, and `vlmtrain eval` (docs/eval.md).");
    v("log", log, "The step log, metrics.jsonl and TensorBoard.");
  }

  // Cross-field checks; throws vlm::Error "file:line: key: problem" naming the key.
  void validate(Purpose purpose) const;
  // "file:line" of a dotted key, or the recipe path when the key came from a default.
  std::string location(const std::string& key) const;
};

// Parses a recipe file, applying `overrides` ("section.key=value", TOML value syntax;
// a bare word is taken as a string) on top. Relative paths stay as written; they are
// resolved against the working directory by the commands that use them.
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from text (tests, fuzzing); `source_name` appears in error messages.
Recipe parse_recipe(const std::string& text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});

// The resolved recipe as TOML (every field, defaults included); parses back to the same.
std::string to_toml(const Recipe& recipe);
// Stable 16-hex-digit hash of to_toml(recipe) (for checkpoints and the rank fingerprint).
std::string recipe_hash(const Recipe& recipe);

// Writes to_toml(recipe) to <dir>/recipe.toml atomically (temp file + rename), creating
// <dir>; returns the path. The header comment records the source file and the hash.
std::string save_resolved_recipe(const Recipe& recipe, const std::string& dir);

// Built-in model presets the recipe may name: vlm::preset_names() (every registered family's).
std::vector<std::string> known_presets();

// The key reference generated from these field lists: app/config/recipe_doc.h.

}  // namespace vlm::app
