// Model FLOPs of a training step (for MFU) and the peak FLOP/s of a rank's device.
//
// FLOP convention (stated in the log header and metrics.jsonl): dense matmul FLOPs only,
// 2 x parameters per token for a unit's forward and 4 x for its backward (so 6N for a
// trained unit, 2N for a frozen one, whose backward never runs); attention score/value
// FLOPs and activation-checkpointing recompute are not counted (both make the reported
// MFU a lower bound). Tokens per unit: vision blocks and patch_embed see every patch,
// the mergers (Qwen3-VL: also the DeepStack mergers) see patches / merge^2 (4), decoder layers, the final norm and the head see every
// non-pad LLM token; the embedding lookup costs nothing, but a tied head costs V x d per
// token like an untied one. Mixture of experts: ACTIVE parameters only (each token counts its
// top-k experts' weights, the router and the shared expert, not all E experts), as Megatron's
// and torchtitan's MFU do for MoE; the all-to-all and the permutation are not FLOPs.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sharding/parallel/policy.h"
#include "vlm/model/config.h"

namespace vlm::app {

class FlopModel {
 public:
  FlopModel(const std::vector<vlm::sharding::UnitPlan>& units, const vlm::VlmConfig& cfg);
  // Model FLOPs of one forward + backward over `llm_tokens` non-pad tokens and `patches`
  // vision patches.
  double flops(int64_t llm_tokens, int64_t patches) const;

 private:
  double per_patch_ = 0;        // 2 or 6 x params of units that see every patch
  double per_merged_patch_ = 0; // mergers (patches / merge_unit_)
  int64_t merge_unit_ = 4;      // patches per merged token: spatial_merge_size^2
  double per_token_ = 0;        // decoder layers, norm, head
};

// Peak dense FLOP/s of one rank's device for matmuls in `dtype` (the parameters'):
// VLMTRAIN_PEAK_TFLOPS when set; on CUDA the data-sheet peak of the GPU by its name
// (gpu_peak_tflops; 0 = unknown GPU: MFU is then not reported, set the variable); on CPU
// the theoretical fp32 peak of the rank's intra-op threads (cores x clock x FLOPs/cycle
// from /proc/cpuinfo). `how` describes the source.
double peak_flops_per_rank(torch::Device device, torch::Dtype dtype, std::string* how);

// Dense (no structured sparsity) data-sheet peak TFLOP/s of an NVIDIA GPU named `name` (as
// cudaGetDeviceProperties reports it, e.g. "NVIDIA H100 80GB HBM3") for matmuls in `dtype`:
// bf16 / fp16 on the tensor cores; fp32 on the CUDA cores (LibTorch leaves TF32 off for
// matmuls). 0 when the GPU is not in the table. Table: H100 SXM, H100 PCIe, H100 NVL, H200
// (SXM and NVL), A100 (SXM and PCIe), B200, L40S.
double gpu_peak_tflops(const std::string& name, torch::Dtype dtype);

}  // namespace vlm::app
