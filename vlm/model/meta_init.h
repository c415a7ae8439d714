// Build on the meta device, then materialise: replace every meta parameter by a real
// tensor on the target device/dtype (= to_empty) and initialise it deterministically:
// normal(0, std) for linear / embedding / patch weights, zeros for biases, ones for norm
// weights. Each parameter's random stream is seeded from (seed, full parameter name), so
// the result does not depend on module order, device or sharding.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

namespace vlm {

class LayerBase;  // vlm/model/layers.h

struct MaterializeOptions {
  torch::Device device = torch::kCPU;
  torch::Dtype dtype = torch::kFloat32;
  uint64_t seed = 0;
  double init_std = 0.02;  // HF initializer_range
  bool init = true;        // false: allocate only (weights are about to be loaded)
                           // and keep the values of parameters that are already real
};

// Gives every parameter of every vlm::LayerBase under `root` a real tensor on
// opts.device / opts.dtype: with opts.init, freshly initialised (meta or not: a module built
// directly on the CPU holds uninitialised torch::empty memory until this runs); without,
// meta parameters are only allocated and real ones keep their values (moved/cast).
// Throws for a meta parameter not owned by a LayerBase.
void materialize(torch::nn::Module& root, const MaterializeOptions& opts);

// The value materialize() with opts.init gives parameter `key` of `layer`, whose full name
// is `full` (the seed's input): on opts.device in opts.dtype.
torch::Tensor initial_value(LayerBase& layer, const std::string& key, const std::string& full,
                            const MaterializeOptions& opts);

// True if any parameter under `root` lives on the meta device.
bool has_meta_parameters(const torch::nn::Module& root);

// Sum of numel over parameters (works on meta); each parameter counted once.
int64_t count_parameters(const torch::nn::Module& root);

// Parameter count of each named module below `root` that directly owns parameters
// (leaf layers), in registration order: ("visual.blocks.0.attn.qkv", 3840*1280+3840).
std::vector<std::pair<std::string, int64_t>> parameter_table(const torch::nn::Module& root);

}  // namespace vlm
