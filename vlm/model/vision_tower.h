// The interface every family's vision tower implements (`visual`): pixels -> image
// features for the LLM, plus the DeepStack features of families that have them, with every
// parameter-owning piece run as a unit through the UnitRunner (sharding's seam).
//
// Names: S packed patches (sum of t*gh*gw over images), M = S / merge^2 merged tokens,
// O merger output width (= LLM hidden).
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "vlm/model/unit_runner.h"

namespace vlm {

struct VisionOutput {
  torch::Tensor features;                 // [M, O] in merge-block order
  std::vector<torch::Tensor> deepstack;   // Qwen3: one [M, O] per DeepStack merger, in LLM
                                          // layer order (empty for the Qwen2 families)
};

class VisionTowerImpl : public torch::nn::Module {
 public:
  // pixel_values: [S, C*T*P*P]; grid_thw: [N, 3] int64 (host) -> features (+ deepstack).
  // Units run through `runner` as "<prefix>.<unit>" in the order of append_units.
  virtual VisionOutput encode(const torch::Tensor& pixel_values, const torch::Tensor& grid_thw,
                              UnitRunner& runner, const std::string& prefix = "visual") = 0;
  // The tower's units in call order ("visual.patch_embed", "visual.blocks.0", ...).
  virtual void append_units(std::vector<Unit>& units, const std::string& prefix = "visual") = 0;
  // Parameters of the connector (merger and DeepStack mergers): `plan` reports them.
  virtual int64_t connector_parameters() = 0;
  // A parameter whose dtype and device the dummy image takes.
  virtual torch::Tensor first_weight() = 0;
};

}  // namespace vlm
