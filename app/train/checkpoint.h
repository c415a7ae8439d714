// Training checkpoints: sharded, resumable on any world size, written atomically.
//
// Layout of <output_dir>/step-<N>/ (N zero-padded to 8 digits so names sort by step):
//   state-rank<R>-of-<W>.safetensors   rank R's StateSlices (sharding/parallel/optimizer.h): for each
//                                      unit vector ("<unit>/master", "/exp_avg",
//                                      "/exp_avg_sq", "/param") the range R owns, plus
//                                      R's RNG states "rng/cpu" and, on CUDA, "rng/cuda"
//                                      (rng_state.h). The header metadata "slices" maps
//                                      key -> [lo, hi, numel].
//   trainer.json                       TrainerState, world size, unit layout (parameter
//                                      names and shapes per unit, for export), recipe
//                                      hash, tokenizer path, versions
//   recipe.toml, config.json           the resolved recipe and the model config
//   COMPLETE                           written last; a directory without it is ignored
//
// Protocol, in three phases (CheckpointWrite; save_checkpoint runs them in a row, the
// asynchronous checkpointer of async_checkpoint.h runs the middle one on a thread of its own):
//   begin  (collective) rank 0 empties <output_dir>/.step-<N>.tmp; an all-reduce tells every
//          rank whether that worked; each rank copies its StateSlices and RNG states into
//          host memory (a snapshot: the optimizer may change its tensors afterwards);
//   write  (local, any thread) each rank writes its state file into the temp directory
//          (temp file, fsync, rename);
//   commit (collective) an all-reduce of "ok" so a failure on one rank fails every rank
//          with the same error (no hang, nothing renamed); rank 0 writes trainer.json /
//          recipe.toml / config.json, renames the directory to step-<N>, fsyncs, writes
//          COMPLETE, prunes to keep_last; a second all-reduce agrees on that.
// A crash at any point leaves the previous complete checkpoint untouched. The directory must
// be one that every rank sees (a shared filesystem): the trainer checks that at start-up
// (output_dir_probe.h).
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

#include "app/train/rng_state.h"
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

// One checkpoint on its way to disk: the protocol's three phases (see the header comment).
class CheckpointWrite {
 public:
  // Begin. Collective on `comm` (the control plane): throws on every rank when rank 0 cannot
  // create the temp directory. Then, locally, the snapshot: model.state_slices() (host
  // copies) and capture_rng_states(rng_device). A local failure of the snapshot is kept and
  // reported by commit() on every rank.
  CheckpointWrite(const std::string& output_dir, const TrainerState& state,
                  const vlm::sharding::ShardedModel& model, vlm::sharding::Comm& comm,
                  const torch::Device& rng_device = torch::kCPU);

  // Write. Local, no collective; may run on any one thread while the training thread goes on.
  // Writes this rank's state file into the temp directory (temp file, fsync, rename). Never
  // throws: a failure is kept for commit(). Test hooks: VLMTRAIN_FAULT_EXIT_IN_SAVE and
  // VLMTRAIN_FAULT_SLOW_SAVE (checkpoint.cpp).
  void write() noexcept;

  // Commit. Collective on `comm`, after write() returned on this rank. Every rank throws the
  // same error when any rank's snapshot or write failed (the checkpoint stays incomplete);
  // otherwise rank 0 finishes step-<N> (COMPLETE last) and prunes to keep_last (> 0).
  // Returns step-<N>'s path.
  std::string commit(vlm::sharding::Comm& comm, const CheckpointFiles& files, int64_t keep_last);

  int64_t step() const { return state_.step; }
  const std::string& final_dir() const { return final_dir_; }
  // Bytes of this rank's snapshot (state slices and RNG states).
  int64_t snapshot_bytes() const;

 private:
  std::string output_dir_, tmp_dir_, final_dir_;
  TrainerState state_;
  int64_t rank_ = 0, world_ = 1;
  int64_t tp_ = 1;                     // the model's tensor-parallel degree (trainer.json)
  nlohmann::json units_;               // unit layout for trainer.json
  vlm::NamedTensors tensors_;          // the snapshot, as written
  std::map<std::string, std::string> metadata_;
  std::string error_;                  // first local failure (snapshot or write), "" if none
};

// Collective: CheckpointWrite's three phases in a row. Returns the checkpoint directory.
// keep_last > 0 prunes older complete ones. rng_device: whose RNG states to save besides
// the CPU's (the rank's device).
std::string save_checkpoint(const std::string& output_dir, const TrainerState& state,
                            const vlm::sharding::ShardedModel& model, vlm::sharding::Comm& comm,
                            const CheckpointFiles& files, int64_t keep_last,
                            const torch::Device& rng_device = torch::kCPU);

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
  // dist.tp of the run that wrote it (1 when absent): its state keys are per tp rank
  // ("tp<r>of<n>/<unit>/<kind>", ShardedModel::state_slices), and read() also serves each
  // parameter's whole state ("<param>/<kind>", the ranks' slices put back together), so it
  // resumes at any tp; consolidated() puts the parameters back together.
  int64_t tensor_parallel() const;
  std::string recipe_hash() const;
  std::string config_json() const;  // text of config.json
  std::string tokenizer_path() const;

  // Elements [lo, hi) of vector `key` (the dtype it was saved in). Throws naming the key
  // when the checkpoint does not hold it or does not cover the range. Besides the stored
  // vectors, every parameter's "<param>/<kind>" (master, exp_avg, exp_avg_sq, param: its part
  // of its unit's vector; step: [1], its entry of the unit's step vector) wherever the run
  // stored it, so that a run splitting units another way (expert parallelism on or off)
  // resumes parameter by parameter.
  torch::Tensor read(const std::string& key, int64_t lo, int64_t hi) const;
  // Elements of `key` as read() serves it, -1 when it cannot.
  int64_t numel(const std::string& key) const;
  vlm::sharding::StateReader reader() const;  // read() and numel()
  // Rank `rank`'s generator state under `key` (kRngCpuKey or kRngCudaKey, rng_state.h); an
  // undefined tensor when the checkpoint does not hold it (no such rank; "rng/cuda" of a
  // checkpoint written on CPU). Any other key throws, naming the two.
  torch::Tensor rng_state(int64_t rank, const std::string& key = kRngCpuKey) const;
  // The RNG keys rank `rank`'s file holds, in file order (empty for no such rank).
  std::vector<std::string> rng_keys(int64_t rank) const;
  // Full parameters under their canonical HF names (registration order), fp32 masters for
  // trainable units and the stored params for frozen ones. A LoRA checkpoint stores no frozen
  // unit ("stored": false in trainer.json's units): then only the adapters
  // (<module>.lora_A.weight / .lora_B.weight) and the units trained in full are returned.
  vlm::NamedTensors consolidated() const;

 private:
  vlm::NamedTensors consolidated_tp() const;  // consolidated() of a tensor-parallel checkpoint
  struct Piece {
    size_t file;
    int64_t lo, hi;
  };
  // Where a parameter's values are: in unit vector "<row>/<kind>" at offset (numel
  // elements), or (expert-parallel rows) in its own "<param>/<kind>"; index: its entry of
  // "<row>/step".
  struct ParamAt {
    std::string row;
    int64_t offset = 0, numel = 0, index = 0;
    bool own_keys = false;
    std::vector<int64_t> shape;  // as stored (a tensor-parallel checkpoint: one rank's slice)
  };
  // A tensor-parallel checkpoint (tensor_parallel() > 1) serves "<param>/<kind>" over the
  // whole parameter: its tp ranks' slices ("tp<t>of<n>/<unit>/<kind>") put back together
  // (the last one kept), and "<param>/step" from tp rank 0's vector. Unprefixed unit vectors
  // are not held, so a reader of another tp loads parameter by parameter.
  bool tp_param_key(const std::string& key, std::string* param, std::string* kind) const;
  torch::Tensor tp_full(const std::string& param, const std::string& kind) const;  // whole, as its shape
  int64_t tp_numel(const std::string& param) const;
  vlm::VlmConfig tp_cfg_;  // config.json (tensor-parallel checkpoints: the splits)
  mutable std::string tp_cache_key_;
  mutable torch::Tensor tp_cache_;
  // The stored key behind "<param>/<kind>" and the offset of its element 0 there ({"", 0}: none).
  std::pair<std::string, int64_t> resolve(const std::string& key) const;
  std::string dir_;
  nlohmann::json meta_;
  std::vector<vlm::SafetensorsFile> files_;
  std::map<std::string, std::vector<Piece>> pieces_;  // key -> pieces, by lo
  std::map<std::string, int64_t> numel_;
  std::map<std::string, ParamAt> params_;             // HF parameter name -> where it is
};

}  // namespace vlm::app
