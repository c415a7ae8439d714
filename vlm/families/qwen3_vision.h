// `visual` of Qwen3-VL: ViT with 16-px patches (patch embedding with bias), a learned 2-D
// position table bilinearly resampled (align_corners) to each image's patch grid, LayerNorm
// blocks with a tanh-GELU MLP and full attention per frame, the main merger, and DeepStack
// mergers that turn the outputs of chosen blocks into extra features for the first LLM layers.
//
// Names: S packed patches, M = S / merge^2 merged tokens, E ViT width, O merger output.
// Units, in call order: patch_embed, pos_embed, blocks.0.. with deepstack_merger_list.k right
// after the block it reads, merger.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "vlm/model/attention.h"
#include "vlm/model/config.h"
#include "vlm/model/layers.h"
#include "vlm/model/mlp.h"
#include "vlm/model/vision_tower.h"

namespace vlm {

// `visual.blocks.N`: x += attn(norm1(x)); x += mlp(norm2(x)) (v.norm, v.mlp: LayerNorm and
// tanh GELU in Qwen3-VL).
class Qwen3VisionBlockImpl : public torch::nn::Module {
 public:
  Qwen3VisionBlockImpl(const VisionConfig& v, const torch::TensorOptions& opts);
  // x: [S, E]; cos/sin: [S, D] fp32 -> [S, E]
  // sp: the tower split over a context-parallel group (vision_split.h): x, cos and sin are
  // this rank's rows, cu_seqlens the whole padded sequence's.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const std::vector<int64_t>& cu_seqlens, SequenceExchange* sp = nullptr);
  Norm norm1{nullptr}, norm2{nullptr};
  VisionAttention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Qwen3VisionBlock);

// `visual.merger` (norm over E before the 2x2 shuffle) and `visual.deepstack_merger_list.k`
// (postshuffle: norm over merge^2 * E after it): LayerNorm, linear_fc1, exact GELU, linear_fc2.
class Qwen3MergerImpl : public torch::nn::Module {
 public:
  Qwen3MergerImpl(const VisionConfig& v, bool postshuffle_norm, const torch::TensorOptions& opts);
  // x: [S, E] -> [S / merge^2, O]
  torch::Tensor forward(const torch::Tensor& x);
  int64_t merged_dim;
  bool postshuffle;
  Norm norm{nullptr};
  Linear linear_fc1{nullptr}, linear_fc2{nullptr};
};
TORCH_MODULE(Qwen3Merger);

// Bilinear (align_corners) taps into the side x side position table for every patch of
// grid_thw [N, 3] in merge-block order, as HF's get_vision_interpolation_indices_and_weights:
// index [S, 4] int64 (row-major table index), weight [S, 4] fp32, computed in fp32 as HF does.
struct PosTaps {
  torch::Tensor index, weight;
};
PosTaps qwen3_position_taps(const torch::Tensor& grid_thw, int64_t side, int64_t merge);

class Qwen3VisionEncoderImpl : public VisionTowerImpl {
 public:
  Qwen3VisionEncoderImpl(const VlmConfig& cfg, const torch::TensorOptions& opts);
  VisionOutput encode(const torch::Tensor& pixel_values, const torch::Tensor& grid_thw, UnitRunner& runner,
                      const std::string& prefix, SequenceExchange* sp) override;
  void append_units(std::vector<Unit>& units, const std::string& prefix) override;
  std::vector<VisionUnitLayout> unit_layouts(const std::string& prefix) override;
  int64_t connector_parameters() override;
  torch::Tensor first_weight() override { return patch_embed->proj->weight; }

  VisionConfig cfg;
  int64_t side;  // sqrt(num_position_embeddings)
  PatchEmbed patch_embed{nullptr};
  Embedding pos_embed{nullptr};
  torch::nn::ModuleList blocks_list{nullptr};  // registered as "blocks"
  std::vector<Qwen3VisionBlock> blocks;
  Qwen3Merger merger{nullptr};
  torch::nn::ModuleList deepstack_list{nullptr};  // "deepstack_merger_list"
  std::vector<Qwen3Merger> deepstack_mergers;

 private:
  // The DeepStack merger reading block b (index into deepstack_mergers), or -1.
  int64_t deepstack_slot(int64_t block) const;
};
TORCH_MODULE(Qwen3VisionEncoder);

}  // namespace vlm
