// The recipe: everything a run needs, as plain typed structs with defaults.
//
// One field list per struct (its `fields()` member) drives parsing, printing and the
// unknown-key check, so a key is named in exactly one place. Parsing (app/config/recipe.cpp)
// reports every error as `file:line: key: what is wrong (expected ..., got ...)`.
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
  std::string name;                      // run name; default: recipe file stem
  std::string output_dir = "runs/run";   // checkpoints, metrics.jsonl, resolved recipe
  int64_t seed = 0;                      // model init, data order, dropout: all derive from it

  template <class V> void fields(V& v) {
    v("name", name);
    v("output_dir", output_dir);
    v("seed", seed, Range{0, 9.0e18});
  }
};

struct ModelSection {
  std::string preset;      // built-in architecture (known_presets(): tiny, ...); random init
  std::string path;        // HF model directory (config.json + safetensors); loads weights
  std::string tokenizer;   // tokenizer.json / .model / directory; default: model.path
  std::string family;      // with preset "" and no config.json: a registered family's model_type
  // Training start-up: build on the meta device and let each rank allocate and read only
  // the parameters it keeps (FSDP shards: its 1/N range, straight from the mmap'd
  // safetensors). false: every rank loads the whole model and rank 0's copy is broadcast
  // (the old path, twice the model's bytes per rank at start; kept for comparison).
  bool sharded_load = true;

  template <class V> void fields(V& v) {
    v("preset", preset);
    v("path", path);
    v("tokenizer", tokenizer);
    v("family", family, Choice{family_choices()});
    v("sharded_load", sharded_load);
  }
};

// Synthetic OCR data generated on first use (the tiny default needs no downloads).
struct SynthSection {
  // Render the set into the folder of data.train[0] when it is missing, or when the
  // synth_ocr.json there records other settings than these or an older renderer.
  bool generate_if_missing = false;
  int64_t train = 4000;              // training lines to render
  int64_t val = 200;                 // validation lines to render
  int64_t seed = 1234;               // rendering seed (independent of run.seed)
  std::string layout = "proportional";  // proportional | grid (see vlmtrain synth-ocr --help)
  std::string style = "varied";         // varied | clean (see vlmtrain synth-ocr --help)
  int64_t min_height = 28;              // line height range in pixels (grid: max_height)
  int64_t max_height = 56;
  std::string tokenizer = "unigram";    // sentencepiece model type: unigram | char
  int64_t vocab_size = 2048;            // unigram vocabulary target

  template <class V> void fields(V& v) {
    v("generate_if_missing", generate_if_missing);
    v("train", train, Range{1, 1e8});
    v("val", val, Range{0, 1e8});
    v("seed", seed, Range{0, 9.0e18});
    v("layout", layout, Choice{{"proportional", "grid"}});
    v("style", style, Choice{{"varied", "clean"}});
    v("min_height", min_height, Range{8, 4096});
    v("max_height", max_height, Range{8, 4096});
    v("tokenizer", tokenizer, Choice{{"unigram", "char"}});
    v("vocab_size", vocab_size, Range{64, 1e6});
  }
};

struct DataSection {
  // Dataset entries (a single string is accepted): JSONL files, JSON-array files (.json,
  // read streaming), or LLaMA-Factory datasets as "path/to/dataset_info.json#name" (or
  // "folder#name" for the folder holding dataset_info.json); see data/dataset_info.h.
  std::vector<std::string> train;
  std::vector<std::string> eval;         // same kinds of entries, scored by eval / periodic eval
  // Record format of every plain file: auto (detected per file from its first record) |
  // messages | llava | ocr (plain) | sharegpt | alpaca (LLaMA-Factory) | swift (ms-swift);
  // dataset_info.json entries always use their own "formatting". See data/dataset.h.
  std::string format = "auto";
  // Base for relative image paths (default: the dataset file's folder; for dataset_info.json
  // entries the dataset_info.json folder, LLaMA-Factory's media_dir).
  std::string image_root;
  std::string prompt = "Read the text in the image.";  // user turn for plain OCR records
  // "" = the model family's default system turn (its registry entry's; some families have
  // none); "none" = no system turn; anything else = that text.
  std::string system_prompt;
  // Cap per image in merged tokens: max_pixels = cap x factor^2, factor = the model's
  // patch x merge (vision_config: 14 x 2 = 28, or 16 x 2 = 32).
  int64_t max_image_tokens = 1024;
  // smart_resize bounds in pixels; 0 = the model's (its preprocessor_config.json, else its
  // family's registry defaults, e.g. 3136 .. 12845056).
  int64_t min_pixels = 0;
  int64_t max_pixels = 0;
  int64_t max_seq_len = 2048;            // longer samples are truncated (never inside an image)
  double max_bad_fraction = 0.01;        // more bad records than this is an error
  int64_t num_workers = 2;               // loader threads
  int64_t prefetch = 4;                  // micro-batches prepared ahead per rank
  bool shuffle = true;                   // reshuffle each epoch (seeded)
  bool group_by_length = false;          // batch samples of similar token cost
  SynthSection synth;

  template <class V> void fields(V& v) {
    v("train", train);
    v("eval", eval);
    v("format", format, Choice{{"auto", "messages", "llava", "ocr", "sharegpt", "alpaca", "swift"}});
    v("image_root", image_root);
    v("prompt", prompt);
    v("system_prompt", system_prompt);
    v("max_image_tokens", max_image_tokens, Range{1, 1e7});
    v("min_pixels", min_pixels, Range{0, 1e10});
    v("max_pixels", max_pixels, Range{0, 1e10});
    v("max_seq_len", max_seq_len, Range{16, 1e7});
    v("max_bad_fraction", max_bad_fraction, Range{0, 1});
    v("num_workers", num_workers, Range{0, 256});
    v("prefetch", prefetch, Range{1, 1024});
    v("shuffle", shuffle);
    v("group_by_length", group_by_length);
    v("synth", synth);
  }
};

struct BatchSection {
  int64_t samples_per_rank = 8;       // samples each rank consumes per optimizer step
  int64_t max_tokens = 4096;          // per micro-batch: padded length x rows (text + image);
                                      // with packing: the sum of the samples' lengths
  int64_t max_image_tokens = 4096;    // per micro-batch: merged image tokens
  int64_t max_micro_batches = 64;     // per step and rank; more needed is an error
  // Padding-free packing (docs/packing.md): whole samples back to back in one row per
  // micro-batch, no padding; each sample keeps its own positions and attends only to itself.
  bool packing = false;

  template <class V> void fields(V& v) {
    v("samples_per_rank", samples_per_rank, Range{1, 1e6});
    v("max_tokens", max_tokens, Range{16, 1e9});
    v("max_image_tokens", max_image_tokens, Range{1, 1e9});
    v("max_micro_batches", max_micro_batches, Range{1, 1e6});
    v("packing", packing);
  }
};

// Per-module optimizer settings: first matching group wins (globs on parameter names).
struct OptimGroup {
  std::string match;                    // e.g. "visual.merger.*|model.embed_tokens.*"
  std::optional<double> lr;             // absent: optim.lr
  std::optional<double> weight_decay;   // absent: optim.weight_decay

  template <class V> void fields(V& v) {
    v("match", match);
    v("lr", lr, Range{0, 10, true});
    v("weight_decay", weight_decay, Range{0, 10});
  }
};

struct OptimSection {
  std::string name = "adamw";             // adamw (fp32 masters)
  double lr = 1e-4;                       // peak learning rate
  double weight_decay = 0.0;              // decoupled (AdamW)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip = 1.0;                 // global L2 norm; 0 disables
  std::string no_decay = "*.bias|*norm*.weight|*ln_q.weight";  // params without weight decay
  int64_t max_bad_steps = 5;              // abort after this many consecutive non-finite steps
  std::vector<OptimGroup> group;          // [[optim.group]] per-module overrides

  template <class V> void fields(V& v) {
    v("name", name, Choice{{"adamw"}});
    v("lr", lr, Range{0, 10, true});
    v("weight_decay", weight_decay, Range{0, 10});
    v("beta1", beta1, Range{0, 1});
    v("beta2", beta2, Range{0, 1});
    v("eps", eps, Range{0, 1, true});
    v("grad_clip", grad_clip, Range{0, 1e6});
    v("no_decay", no_decay);
    v("max_bad_steps", max_bad_steps, Range{1, 1e6});
    v("group", group);
  }
};

struct ScheduleSection {
  int64_t steps = 0;                  // optimizer steps; 0 = derive from epochs
  double epochs = 0;                  // used when steps = 0
  int64_t warmup_steps = 0;           // linear warmup from 0
  std::string decay = "cosine";       // cosine | linear | constant (after warmup)
  double min_lr_ratio = 0.0;          // floor of the decay as a fraction of optim.lr

  template <class V> void fields(V& v) {
    v("steps", steps, Range{0, 1e9});
    v("epochs", epochs, Range{0, 1e6});
    v("warmup_steps", warmup_steps, Range{0, 1e9});
    v("decay", decay, Choice{{"cosine", "linear", "constant"}});
    v("min_lr_ratio", min_lr_ratio, Range{0, 1});
  }
};

struct PrecisionSection {
  std::string param_dtype = "fp32";   // compute dtype of parameters: fp32 | bf16
  std::string reduce_dtype = "fp32";  // gradient reduction dtype: fp32 | bf16
  // Optimizer masters are always fp32.

  template <class V> void fields(V& v) {
    v("param_dtype", param_dtype, Choice{{"fp32", "bf16"}});
    v("reduce_dtype", reduce_dtype, Choice{{"fp32", "bf16"}});
  }
};

struct ActivationCheckpointingSection {
  std::string match;   // units recomputed in backward, e.g. "model.layers.*"; "" = none

  template <class V> void fields(V& v) { v("match", match); }
};

// One row of the policy table: the first rule whose glob matches a module wins.
struct ShardingRule {
  std::string match;      // globs on module paths, '|' = or: "visual.blocks.*|visual.patch_embed"
  std::string policy;     // freeze | ddp | fsdp | lora
  std::string strategy;   // fsdp: full_shard | shard_grad_op | hybrid_shard (full_shard within
                          // groups of dist.dp_shard ranks, replicated across them) | no_shard;
                          // ddp: "" | shard_optimizer;
                          // freeze and lora: "" | no_shard (replicated) | full_shard (the frozen
                          // weights sharded, gathered for forward and backward)
  // policy = "lora" only (sharding/parallel/lora.h; PEFT's LoraConfig names in brackets):
  std::optional<int64_t> r;             // rank [r], default 8
  std::optional<double> alpha;          // scaling alpha / r [lora_alpha], default 16
  std::optional<double> dropout;        // on the adapter input [lora_dropout], default 0
  std::optional<bool> rslora;           // scaling alpha / sqrt(r) [use_rslora], default false
  std::optional<std::string> init;      // A init: kaiming [True] | gaussian ["gaussian"]; B = 0

  template <class V> void fields(V& v) {
    v("match", match);
    v("policy", policy, Choice{{"freeze", "ddp", "fsdp", "lora"}});
    v("strategy", strategy, Choice{{"", "full_shard", "shard_grad_op", "hybrid_shard", "no_shard", "shard_optimizer"}});
    v("r", r, Range{1, 1e6});
    v("alpha", alpha, Range{0, 1e9, true});
    v("dropout", dropout, Range{0, 0.999});
    v("rslora", rslora);
    v("init", init, Choice{{"kaiming", "gaussian"}});
  }
};

struct ShardingSection {
  std::string default_policy = "ddp";   // key `default`: policy of parameters no rule matches
  std::string default_strategy;         // strategy for the default policy
  double ddp_bucket_mb = 25;            // DDP gradient bucket size
  // FSDP gradient accumulation over a step's micro-batches: "sharded" reduce-scatters every
  // micro-batch into the fp32 shard grad; "unsharded" keeps each unit's unsharded gradient
  // sum (N*S x reduce dtype) and reduce-scatters once per step (less traffic, more memory).
  std::string fsdp_accumulate = "sharded";
  // Optimizer state offload (ZeRO-Offload): fp32 masters and AdamW moments in (pinned) host
  // memory, the update on the host while the next forward runs; the device keeps none.
  bool optimizer_offload = false;
  std::vector<ShardingRule> module;     // [[sharding.module]] rules, in file order

  template <class V> void fields(V& v) {
    v("default", default_policy, Choice{{"freeze", "ddp", "fsdp"}});
    v("default_strategy", default_strategy,
      Choice{{"", "full_shard", "shard_grad_op", "hybrid_shard", "no_shard", "shard_optimizer"}});
    v("ddp_bucket_mb", ddp_bucket_mb, Range{0.001, 1e5});
    v("fsdp_accumulate", fsdp_accumulate, Choice{{"sharded", "unsharded"}});
    v("optimizer_offload", optimizer_offload);
    v("module", module);
  }
};

struct DistSection {
  std::string backend = "auto";   // auto (nccl on CUDA, gloo on CPU) | gloo | nccl
  std::string device = "auto";    // auto (cuda when available) | cpu | cuda
  double timeout_s = 600;         // every collective and the rendezvous
  int64_t dp_shard = 0;           // hybrid_shard units: ranks per shard group (mesh dp_replicate x
                                  // dp_shard); 0 = the ranks of one node (LOCAL_WORLD_SIZE); must
                                  // divide the world size

  template <class V> void fields(V& v) {
    v("backend", backend, Choice{{"auto", "gloo", "nccl"}});
    v("device", device, Choice{{"auto", "cpu", "cuda"}});
    v("timeout_s", timeout_s, Range{1, 1e6});
    v("dp_shard", dp_shard, Range{0, 1e6});
  }
};

struct CheckpointSection {
  int64_t every = 0;              // steps between checkpoints; 0 = only at the end
  int64_t keep_last = 2;          // older complete checkpoints are pruned
  std::string resume = "auto";    // auto (latest complete in output_dir) | none | PATH
  bool save_final = true;         // checkpoint after the last step

  template <class V> void fields(V& v) {
    v("every", every, Range{0, 1e9});
    v("keep_last", keep_last, Range{1, 1e6});
    v("resume", resume);
    v("save_final", save_final);
  }
};

struct EvalSection {
  int64_t every = 0;                // steps between periodic evals; 0 = none
  int64_t max_samples = 64;         // per dataset during training (0 = all)
  bool at_end = true;               // full eval on data.eval after training
  int64_t max_new_tokens = 64;
  int64_t batch_size = 8;
  std::vector<std::string> metrics = {"cer", "wer", "ned", "em", "anls", "ocrbench"};
  bool case_sensitive = true;       // normalisation (echoed in eval_summary.json)
  bool collapse_whitespace = true;
  bool strip_punctuation = false;
  bool nfc = true;
  // Generation settings. Each key left out takes the value of the model directory's
  // generation_config.json (model.path), else HF's default (greedy, no penalty): recipe /
  // --set > generation_config.json > defaults. Resolved values and where each came from
  // are logged and written to eval_summary.json under "generation".
  std::optional<bool> do_sample;              // false: greedy
  std::optional<double> temperature;          // sampling only, > 0
  std::optional<int64_t> top_k;               // sampling only; 0 = off
  std::optional<double> top_p;                // sampling only, (0, 1]
  std::optional<double> repetition_penalty;   // > 0; 1 = off (HF's definition)
  int64_t seed = 0;                           // sampling stream

  template <class V> void fields(V& v) {
    v("every", every, Range{0, 1e9});
    v("max_samples", max_samples, Range{0, 1e9});
    v("at_end", at_end);
    v("max_new_tokens", max_new_tokens, Range{1, 1e6});
    v("batch_size", batch_size, Range{1, 1e5});
    v("metrics", metrics, Choice{{"cer", "wer", "ned", "em", "anls", "ocrbench"}});
    v("case_sensitive", case_sensitive);
    v("collapse_whitespace", collapse_whitespace);
    v("strip_punctuation", strip_punctuation);
    v("nfc", nfc);
    v("do_sample", do_sample);
    v("temperature", temperature, Range{0, 1e6, true});
    v("top_k", top_k, Range{0, 1e9});
    v("top_p", top_p, Range{0, 1, true});
    v("repetition_penalty", repetition_penalty, Range{0, 1e6, true});
    v("seed", seed, Range{0, 9e15});
  }
};

struct LogSection {
  int64_t every = 1;              // steps between log lines
  std::string level = "info";     // trace | debug | info | warn | error (env VLMTRAIN_LOG_LEVEL wins)
  bool all_ranks = false;         // log from every rank, not only rank 0
  bool tensorboard = true;        // TensorBoard event files under <run.output_dir>/tb/ (rank 0)

  template <class V> void fields(V& v) {
    v("every", every, Range{1, 1e9});
    v("level", level, Choice{{"trace", "debug", "info", "warn", "error"}});
    v("all_ranks", all_ranks);
    v("tensorboard", tensorboard);
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
    v("run", run);
    v("model", model);
    v("data", data);
    v("batch", batch);
    v("optim", optim);
    v("schedule", schedule);
    v("precision", precision);
    v("activation_checkpointing", activation_checkpointing);
    v("sharding", sharding);
    v("dist", dist);
    v("checkpoint", checkpoint);
    v("eval", eval);
    v("log", log);
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

}  // namespace vlm::app
