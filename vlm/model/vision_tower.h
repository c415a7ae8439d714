// The interface every family's vision tower implements (`visual`): pixels -> image
// features for the LLM, plus the DeepStack features of families that have them, with every
// parameter-owning piece run as a unit through the UnitRunner (sharding's seam), and a
// description of those units for the activation cost model.
//
// Names: S packed patches (sum of t*gh*gw over images), M = S / merge^2 merged tokens,
// O merger output width (= LLM hidden).
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "vlm/model/layer_kinds.h"
#include "vlm/model/sequence_parallel.h"
#include "vlm/model/unit_runner.h"

namespace vlm {

struct VisionOutput {
  torch::Tensor features;                 // [M, O] in merge-block order
  std::vector<torch::Tensor> deepstack;   // Qwen3: one [M, O] per DeepStack merger, in LLM
                                          // layer order (empty for the Qwen2 families)
};

// One unit of a tower as the activation cost model (app/plan/activation_memory.cpp) counts it:
// which shared layers it runs, under which names, on which rows. The tower reports its own
// units (VisionTowerImpl::unit_layouts), so the cost model needs no knowledge of families.
struct VisionUnitLayout {
  enum class Kind {
    patch_embed,  // the pixels -> a new [S, E] (a Linear over each flattened patch)
    table_add,    // x + rows resampled from a learned table: a new [S, E] sum (`pos_embed`)
    block,        // x += attn(norm1 x) (attn.qkv, attn.proj); x += mlp(norm2 x), [S, E]
    merger,       // <norm>, merge^2 rows shuffled into one, <fc1>, exact GELU, <fc2> -> [M, O]
  };
  Kind kind = Kind::block;
  std::string path;   // "visual.blocks.3"
  int input = -1;     // index in the tower's list of the unit whose output this one reads
                      // (-1: the pixels)
  NormKind norm = NormKind::layer_norm;  // block: norm1 and norm2; merger: its norm
  MlpKind mlp = MlpKind::quick_gelu;     // block: its MLP (children named by vlm::Mlp)
  bool postshuffle_norm = false;         // merger: its norm over merge^2 * E after the shuffle
                                         // (else over each patch's E before it)
  std::string norm_name, fc1_name, fc2_name;  // merger: its children ("ln_q", "mlp.0", "mlp.2")
};

class VisionTowerImpl : public torch::nn::Module {
 public:
  // pixel_values: [S, C*T*P*P]; grid_thw: [N, 3] int64 (host) -> features (+ deepstack).
  // Units run through `runner` as "<prefix>.<unit>" in the order of append_units. sp: split
  // the patches over a context-parallel group (vision_split.h; every rank of the group calls
  // with the same micro-batch and gets every feature); null: whole.
  virtual VisionOutput encode(const torch::Tensor& pixel_values, const torch::Tensor& grid_thw,
                              UnitRunner& runner, const std::string& prefix = "visual",
                              SequenceExchange* sp = nullptr) = 0;
  // The tower's units in call order ("visual.patch_embed", "visual.blocks.0", ...).
  virtual void append_units(std::vector<Unit>& units, const std::string& prefix = "visual") = 0;
  // The same units, in the same order, as the activation cost model counts them.
  virtual std::vector<VisionUnitLayout> unit_layouts(const std::string& prefix = "visual") = 0;
  // Parameters of the connector (merger and DeepStack mergers): `plan` reports them.
  virtual int64_t connector_parameters() = 0;
  // A parameter whose dtype and device the dummy image takes.
  virtual torch::Tensor first_weight() = 0;
};

}  // namespace vlm
