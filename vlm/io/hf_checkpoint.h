// HF checkpoint directories: read (single file or sharded index), load into any
// torch::nn::Module by parameter name, and write (sharded, atomic).
//
// Canonical names are the legacy Qwen2-VL ones, which are also the module tree's names
// (docs/design.md, "Module names = HF names"):
//   visual.*         <- also accepted as model.visual.*
//   model.*          <- also accepted as model.language_model.*
//   lm_head.weight   (top level in both styles; may be absent when tied to the embedding)
//
// Directory layouts read:
//   <dir>/model.safetensors                                  (one file), or
//   <dir>/model.safetensors.index.json + the shard files it names
//     {"metadata": {"total_size": <bytes>}, "weight_map": {"<name>": "<file>", ...}}
// A path to a single .safetensors file is accepted as well.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "vlm/model/config.h"
#include "vlm/io/safetensors.h"

namespace vlm {

// ---------------------------------------------------------------- names
// "model.visual.x" -> "visual.x", "model.language_model.x" -> "model.x", else unchanged.
std::string canonical_hf_name(const std::string& name);

enum class HfNameStyle {
  kLegacy,  // visual.*, model.*, lm_head.weight (Qwen2-VL hub checkpoints)
  kNested,  // model.visual.*, model.language_model.*, lm_head.weight (newer transformers)
};
// Canonical name -> the name written in `style`.
std::string styled_hf_name(const std::string& canonical, HfNameStyle style);

// ---------------------------------------------------------------- reading
// A checkpoint opened for reading: every file's header is validated at open (the data is
// only mapped, not read), then tensors are fetched by canonical name on demand. Fetching
// a tensor touches only that tensor's pages, so a rank can read just what it needs
// (get(name).narrow(0, begin, len) reads only those rows). Thread-safe after open().
class HfCheckpoint {
 public:
  // `dir_or_file`: a directory (model.safetensors, else model.safetensors.index.json) or a
  // .safetensors file. Throws vlm::Error naming the file and the problem: missing files,
  // an index that names a tensor its file does not hold, a file holding tensors the index
  // does not map to it, two names that normalise to the same canonical name.
  static HfCheckpoint open(const std::string& dir_or_file);

  const std::string& path() const { return path_; }
  bool sharded() const { return sharded_; }
  // Canonical names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& canonical) const { return entries_.count(canonical) + fused_.count(canonical) != 0; }
  // dtype / shape / offsets without reading data. Throws when absent.
  const StTensorInfo& info(const std::string& canonical) const;
  // The name as stored in the file, and the file (path) holding it.
  const std::string& stored_name(const std::string& canonical) const;
  const std::string& file_of(const std::string& canonical) const;
  // The tensor on CPU in its stored dtype (zero-copy view into the mapping when aligned).
  torch::Tensor get(const std::string& canonical) const;
  // Flat elements [lo, hi) of it, stored dtype, on CPU (SafetensorsFile::get_range).
  torch::Tensor get_range(const std::string& canonical, int64_t lo, int64_t hi) const;
  // The opened files, one per shard.
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // "metadata.total_size" of the index when present (not checked against the files: hub
  // indexes disagree with the sum of tensor bytes often enough to make it useless).
  std::optional<uint64_t> index_total_size() const { return index_total_size_; }

 private:
  struct Entry {
    size_t file = 0;
    std::string stored_name;
  };
  // Experts stored one tensor per expert (`<p>.experts.<e>.{gate,up,down}_proj.weight`, the
  // Qwen3.5-MoE hub layout) appear fused, as the model holds them: `<p>.experts.gate_up_proj`
  // [E, 2I, d] (expert e's gate rows, then its up rows) and `<p>.experts.down_proj` [E, d, I],
  // read from the per-expert tensors (which are then not listed).
  struct Fused {
    StTensorInfo info;          // name, dtype, shape (offsets: 0 .. nbytes)
    std::vector<Entry> parts;   // in flat order, each a whole stored tensor
    std::vector<int64_t> numel; // of each part
  };
  const Entry& entry(const std::string& canonical) const;
  void add_file(SafetensorsFile file);
  void fuse_per_expert_tensors();

  std::string path_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, Fused> fused_;
  std::optional<uint64_t> index_total_size_;
};

// ---------------------------------------------------------------- loading into a module
struct LoadOptions {
  // Tensors in the checkpoint that the module has no parameter/buffer for: error when
  // false (default), counted and listed in the report when true.
  bool allow_unexpected = false;
  // Buffers (LibTorch has no "persistent" flag) are loaded when the checkpoint holds them;
  // a buffer absent from the checkpoint keeps its value unless this is true.
  bool require_buffers = false;
  // Loading a submodule: the checkpoint name of module tensor "x" is prefix + "x" (e.g.
  // prefix "visual." to load a vision tower alone). Checkpoint tensors outside the prefix
  // are not unexpected.
  std::string prefix;
  // Checkpoint tensors left unread and not counted as unexpected (a tied model's redundant
  // lm_head.weight; see resolve_tied_head).
  std::set<std::string> ignore;
  // Module tensor (full name) -> the checkpoint tensor to read it from instead of its own
  // name (model.embed_tokens.weight <- lm_head.weight; see resolve_tied_head).
  std::map<std::string, std::string> read_from;
};

struct LoadReport {
  int64_t loaded = 0;           // tensors copied into the module
  int64_t tied_skipped = 0;     // parameters sharing storage with one already loaded
  int64_t buffers_kept = 0;     // buffers absent from the checkpoint, left as they were
  int64_t converted = 0;        // of `loaded`, how many changed dtype on the way
  uint64_t bytes_read = 0;      // checkpoint bytes copied
  std::vector<std::string> unexpected;  // checkpoint names not in the module (allow_unexpected)
};

// Copies every parameter and buffer of `module` from the checkpoint, by the module's
// recursive names (which must be canonical HF names). Checks shapes (error names the
// tensor and both shapes), converts dtype, copies under NoGradGuard onto the parameter's
// device. Parameters that share storage with one already handled (tied weights, e.g.
// lm_head.weight = model.embed_tokens.weight) are skipped, and may be absent from the
// checkpoint. Missing parameters: one error listing up to 10 of them and the count.
// Everything is checked before the first copy, so a failed load leaves the module as it
// was. Tensors on the meta device are an error (set_data refuses to swap a meta tensor
// for a real one): materialise first, then load.
LoadReport load_module_weights(torch::nn::Module& module, const HfCheckpoint& ckpt,
                               const LoadOptions& opts = {});
LoadReport load_module_weights(torch::nn::Module& module, const std::string& dir_or_file,
                               const LoadOptions& opts = {});

// load_module_weights' first half: every module tensor mapped onto its checkpoint tensor,
// with all its checks (missing, shapes, unexpected; meta tensors unless allow_meta), and
// nothing read. `report` holds tied_skipped, buffers_kept and unexpected.
struct LoadPlanEntry {
  std::string own;    // the module's name for it (without prefix)
  std::string name;   // the checkpoint tensor it is read from (canonical)
  torch::Tensor dst;  // the module's tensor
  bool is_param = true;
};
struct LoadPlan {
  std::vector<LoadPlanEntry> todo;
  LoadReport report;
};
LoadPlan plan_module_load(const torch::nn::Module& module, const HfCheckpoint& ckpt, const LoadOptions& opts,
                          bool allow_meta);

// The module's parameters then buffers, by recursive name, in registration order
// (tied parameters appear under each of their names; save_hf_checkpoint drops repeats).
NamedTensors module_state(const torch::nn::Module& module);

// ---------------------------------------------------------------- tied head
// What transformers 5.23 does when it loads a checkpoint into a model whose config says
// tie_word_embeddings (PreTrainedModel.tie_weights during from_pretrained):
//   checkpoint has embed_tokens only          -> tied (nothing to do);
//   has both, equal values                    -> tied; lm_head.weight is ignored;
//   has both, different values                -> NOT tied (HF warns and keeps both): cfg is
//                                                untied, lm_head.weight is loaded as the head;
//   has lm_head.weight only                   -> tied, the embedding is read from lm_head.weight.
// A config that is not tied is left alone (a missing lm_head.weight is then an error at
// load). Call between load_hf_config and building the model; pass the returned options to
// load_module_weights.
struct TiedHead {
  LoadOptions load;  // ignore / read_from set as above
  std::string note;  // one line for the log when the checkpoint held lm_head.weight; "" otherwise
};
TiedHead resolve_tied_head(VlmConfig& cfg, const HfCheckpoint& ckpt, LoadOptions base = {});

// ---------------------------------------------------------------- writing
struct SaveHfOptions {
  // Floating-point tensors are written in this dtype (bf16 like hub checkpoints, or fp32);
  // unset keeps each tensor's dtype. Integer/bool tensors always keep theirs.
  std::optional<torch::ScalarType> dtype = torch::kBFloat16;
  // A new shard starts when adding the next tensor would pass this many data bytes
  // (a tensor larger than the limit gets a shard of its own).
  uint64_t max_shard_bytes = 5'000'000'000ULL;
  HfNameStyle style = HfNameStyle::kLegacy;
  // Other files written into the directory (e.g. {"config.json", text}).
  std::vector<std::pair<std::string, std::string>> extra_files;
  // Written as "__metadata__" of every shard.
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  // Replace an existing directory (only after the new one is complete). When false, an
  // existing `dir` is an error.
  bool overwrite = false;
};

struct SaveHfReport {
  std::vector<std::string> files;  // file names written (shards, index, extra files)
  int64_t tensors_written = 0;
  int64_t tied_skipped = 0;        // tensors dropped because they share storage with an earlier one
  uint64_t total_size = 0;         // data bytes over all shards
};

// Writes `tensors` (canonical names, in order) as an HF checkpoint directory: one
// `model.safetensors` when one shard suffices, else `model-0000K-of-0000N.safetensors`
// plus `model.safetensors.index.json`. Everything goes into a temp directory beside `dir`,
// is fsynced, then renamed into place; on failure nothing is left behind and an existing
// `dir` is untouched.
SaveHfReport save_hf_checkpoint(const std::string& dir, const NamedTensors& tensors,
                                const SaveHfOptions& opts = {});

}  // namespace vlm
