// Where a model's parameter values come from when they are materialised piece by piece
// (sharded loading: each rank gives real memory only to what it keeps, and reads only
// that; sharding/parallel/sharded_load.h).
//
//   vlm::VisionLanguageModel m(cfg, meta_options);                        // built on the meta device
//   auto src = vlm::checkpoint_param_source(*m, ckpt, tied.load);   // checks everything first
//   src->fill("model.layers.0.mlp.up_proj.weight", lo, hi, out);    // out: [hi - lo], any device/dtype
//
// Names are the module's full parameter names (canonical HF names). A LoRA adapter
// parameter ("<linear>.lora_A.weight") has no checkpoint tensor: it takes the adapter's
// initial value (vlm/model/lora.h lora_init_value), as add_lora would have given it.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/meta_init.h"

namespace vlm {

class ParamSource {
 public:
  virtual ~ParamSource() = default;
  // Writes flat elements [lo, hi) (row-major) of parameter `name` into out [hi - lo],
  // converting to out's dtype and device. Throws vlm::Error for an unknown name.
  virtual void fill(const std::string& name, int64_t lo, int64_t hi, torch::Tensor out) = 0;
  // "HF /models/x" or "random init (seed 3)", for the log.
  virtual std::string describe() const = 0;
  // Gives back memory the source holds for what fill() read (the checkpoint's mapped pages
  // in this process's RSS); later fills read again. Called after each unit.
  virtual void drop_resident_pages() {}
  // Checkpoint bytes copied by fill() so far (0 for random init).
  uint64_t bytes_read() const { return bytes_read_; }

 protected:
  uint64_t bytes_read_ = 0;
};

// Reads from an HF checkpoint through load_module_weights' mapping (tied head, ignore,
// read_from of `opts`): every parameter and buffer of `module` (meta or not) is checked
// against the checkpoint now, before anything is read, with load_module_weights' errors.
// `module` must outlive the source (LoRA parameters are looked up in it at fill time);
// the checkpoint is copied (it shares the mapped files).
std::unique_ptr<ParamSource> checkpoint_param_source(torch::nn::Module& module, const HfCheckpoint& ckpt,
                                                     const LoadOptions& opts = {});

// Random init: the values materialize(module, opts) gives each parameter (same seeds, same
// rules; fp32 draws on the CPU, then converted), computed one parameter at a time.
std::unique_ptr<ParamSource> init_param_source(torch::nn::Module& module, const MaterializeOptions& opts);

// Replaces parameters by full name (meta or real) through the vlm::LayerBase that owns
// each (requires_grad kept). Indexes the tree once, at construction.
class LayerBase;
class ParamReplacer {
 public:
  explicit ParamReplacer(torch::nn::Module& root);
  // Throws vlm::Error when no LayerBase owns a parameter of that name.
  void replace(const std::string& name, torch::Tensor value);

 private:
  std::map<std::string, std::pair<LayerBase*, std::string>> owners_;  // name -> (layer, key)
};

}  // namespace vlm
