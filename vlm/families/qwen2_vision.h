// `visual`: the ViT of Qwen2-VL / Qwen2.5-VL over a packed multi-image sequence.
//
// Names: S packed patches (sum of t*gh*gw over images), M = S / merge^2 merged tokens,
// E ViT width, D head_dim, O merger output width (= LLM hidden).
// Rows of pixel_values, the rotary ids and the merger grouping share the merge-block order
// (2x2 blocks in raster order). Qwen2.5 permutes merged-token groups into windows before
// the blocks and restores the order after the merger.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "vlm/model/attention.h"
#include "vlm/model/config.h"
#include "vlm/model/layers.h"
#include "vlm/model/merger.h"
#include "vlm/model/mlp.h"
#include "vlm/model/unit_runner.h"
#include "vlm/model/vision_tower.h"

namespace vlm {

// `visual.blocks.N`: x += attn(norm1(x)); x += mlp(norm2(x)).
class Qwen2VisionBlockImpl : public torch::nn::Module {
 public:
  Qwen2VisionBlockImpl(const VlmConfig& cfg, const torch::TensorOptions& opts);
  // x: [S, E]; cos/sin: [S, D] fp32; cu_seqlens: segment bounds (images or windows) -> [S, E]
  // sp: the tower split over a context-parallel group (vision_split.h): x, cos and sin are
  // this rank's rows, cu_seqlens the whole padded sequence's.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const std::vector<int64_t>& cu_seqlens, SequenceExchange* sp = nullptr);
  Norm norm1{nullptr}, norm2{nullptr};
  VisionAttention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Qwen2VisionBlock);

// [0, cumsum of gh*gw repeated t times per image]: per-frame full-attention segments.
std::vector<int64_t> image_cu_seqlens(const torch::Tensor& grid_thw);

// Qwen2.5 windows: `index` [M] int64 lists merged tokens window by window (windows of
// w x w merged tokens, w = window_size / merge / patch, tiled in raster order per frame,
// tokens in raster order inside a window, padding dropped); `cu_seqlens` are the window
// bounds in patches (x merge^2), empty windows removed.
struct WindowIndex {
  torch::Tensor index;
  std::vector<int64_t> cu_seqlens;
};
WindowIndex get_window_index(const torch::Tensor& grid_thw, const VisionConfig& vc);

// The Qwen2-VL / Qwen2.5-VL tower (registry: families/qwen2_vl.cpp): norms and MLP of
// cfg.vision.norm / .mlp, window attention when cfg.vision.window_attention().
class Qwen2VisionEncoderImpl : public VisionTowerImpl {
 public:
  Qwen2VisionEncoderImpl(const VlmConfig& cfg, const torch::TensorOptions& opts);
  VisionOutput encode(const torch::Tensor& pixel_values, const torch::Tensor& grid_thw, UnitRunner& runner,
                      const std::string& prefix, SequenceExchange* sp) override {
    return {forward(pixel_values, grid_thw, runner, prefix, sp), {}};
  }
  void append_units(std::vector<Unit>& units, const std::string& prefix) override;
  std::vector<VisionUnitLayout> unit_layouts(const std::string& prefix) override;
  int64_t connector_parameters() override;
  torch::Tensor first_weight() override { return patch_embed->proj->weight; }
  // pixel_values: [S, C*T*P*P]; grid_thw: [N, 3] int64 -> image features [M, O] in
  // merge-block order. Units run through `runner` as "<prefix>.patch_embed",
  // "<prefix>.blocks.N", "<prefix>.merger". sp: VisionTowerImpl::encode's.
  torch::Tensor forward(const torch::Tensor& pixel_values, const torch::Tensor& grid_thw,
                        UnitRunner& runner, const std::string& prefix = "visual", SequenceExchange* sp = nullptr);
  VlmConfig cfg;
  PatchEmbed patch_embed{nullptr};
  torch::nn::ModuleList blocks_list{nullptr};  // registered as "blocks"
  std::vector<Qwen2VisionBlock> blocks;
  PatchMerger merger{nullptr};
};
TORCH_MODULE(Qwen2VisionEncoder);

}  // namespace vlm
