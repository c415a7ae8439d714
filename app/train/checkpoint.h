// Training checkpoints: sharded, resumable on any world size, written atomically.
//
// Layout of <output_dir>/step-<N>/ (N zero-padded to 8 digits so names sort by step):
//   state-rank<R>-of-<W>.safetensors   rank R's StateSlices (sharding/parallel/optimizer.h): for each
//                                      unit vector ("<unit>/master", "/exp_avg",
//                                      "/exp_avg_sq", "/param") the range R owns, plus
//                                      "rng/cpu" (R's torch CPU generator state). The
//                                      header metadata "slices" maps key -> [lo, hi, numel].
//   trainer.json                       TrainerState, world size, unit layout (parameter
//                                      names and shapes per unit, for export), recipe
//                                      hash, tokenizer path, versions
//   recipe.toml, config.json           the resolved recipe and the model config
//   COMPLETE                           written last; a directory without it is ignored
//
// Protocol (save_checkpoint, collective): rank 0 empties <output_dir>/.tmp-step-<N>; barrier;
// every rank writes its state file (temp file, fsync, rename); an all-reduce of "ok" so a
// failure on one rank fails every rank with the same error (no hang, nothing renamed);
// rank 0 writes trainer.json / recipe.toml / config.json, renames the directory to
// step-<N>, fsyncs, writes COMPLETE, prunes to keep_last; barrier. A crash at any point
// leaves the previous complete checkpoint untouched.
//
// Reading (CheckpointReader) serves any range of any unit vector from whichever rank
// files hold it, so a run resumes on another world size; it also consolidates the full
// tensors under their HF names (export, eval --checkpoint).
#pragma once
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/sampler.h"
#include "sharding/dist/comm.h"
#include "sharding/parallel/sharded_model.h"
#include "vlm/io/safetensors.h"

namespace vlm::app {

// Where training stands; saved in trainer.json.
struct TrainerState {
  int64_t step = 0;              // optimizer steps done (including skipped non-finite ones)
  int64_t optimizer_steps = 0;   // AdamW updates applied (bias correction)
  vlm::data::SamplerCursor cursor;  // data position after `step`
  int64_t bad_steps = 0;         // non-finite steps skipped so far
  int64_t consecutive_bad = 0;
  int64_t tokens_seen = 0;       // supervised tokens
  int64_t samples_seen = 0;
  int64_t images_seen = 0;
  double train_seconds = 0;      // wall time spent in steps so far (all previous runs)

  nlohmann::json to_json() const;
  static TrainerState from_json(const nlohmann::json& j, const std::string& source);
};

struct CheckpointFiles {
  std::string recipe_toml;     // resolved recipe text
  std::string recipe_hash;
  std::string config_json;     // model config (HF config.json)
  std::string tokenizer_path;  // as given in the recipe (made absolute)
};

// "<output_dir>/step-00000200".
std::string checkpoint_dir(const std::string& output_dir, int64_t step);

// Collective. Returns the checkpoint directory. keep_last > 0 prunes older complete ones.
std::string save_checkpoint(const std::string& output_dir, const TrainerState& state,
                            const vlm::sharding::ShardedModel& model, vlm::sharding::Comm& comm,
                            const CheckpointFiles& files, int64_t keep_last);

// Complete checkpoints under output_dir, oldest first (by step).
std::vector<std::string> complete_checkpoints(const std::string& output_dir);
// "auto": the newest complete checkpoint in output_dir (nullopt if none); "none": nullopt;
// else the path itself, which must be a complete checkpoint (error otherwise).
std::optional<std::string> resolve_resume(const std::string& resume, const std::string& output_dir);

class CheckpointReader {
 public:
  // Validates COMPLETE, trainer.json and every rank file it lists (throws naming the file).
  explicit CheckpointReader(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const nlohmann::json& trainer_json() const { return meta_; }
  TrainerState state() const;
  int64_t world_size() const;
  std::string recipe_hash() const;
  std::string config_json() const;  // text of config.json
  std::string tokenizer_path() const;

  // Elements [lo, hi) of vector `key` (the dtype it was saved in). Throws naming the key
  // when the checkpoint does not hold it or does not cover the range.
  torch::Tensor read(const std::string& key, int64_t lo, int64_t hi) const;
  vlm::sharding::StateReader reader() const;
  // Rank `rank`'s CPU generator state (undefined when absent).
  torch::Tensor rng_state(int64_t rank) const;
  // Full parameters under their canonical HF names (registration order), fp32 masters for
  // trainable units and the stored params for frozen ones. A LoRA checkpoint stores no frozen
  // unit ("stored": false in trainer.json's units): then only the adapters
  // (<module>.lora_A.weight / .lora_B.weight) and the units trained in full are returned.
  vlm::NamedTensors consolidated() const;

 private:
  struct Piece {
    size_t file;
    int64_t lo, hi;
  };
  std::string dir_;
  nlohmann::json meta_;
  std::vector<vlm::SafetensorsFile> files_;
  std::map<std::string, std::vector<Piece>> pieces_;  // key -> pieces, by lo
  std::map<std::string, int64_t> numel_;
};

}  // namespace vlm::app
