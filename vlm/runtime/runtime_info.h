// What this binary was built against and what it sees at run time: vlmtrain, LibTorch,
// CUDA, cuDNN and NCCL versions, and the number of GPUs. For `vlmtrain --version`, the
// start-up fingerprint and checkpoint metadata.
#pragma once
#include <string>

namespace vlm {

struct RuntimeInfo {
  std::string vlmtrain;  // "0.2.0"
  std::string torch;     // "2.11.0" (the linked LibTorch)
  std::string cuda;      // "13.0", or "none" (LibTorch built without CUDA)
  std::string cudnn;     // "9.19.0", or "none"
  std::string nccl;      // "2.28.9", or "none"
  int gpus = 0;          // CUDA devices visible to this process (0 without a driver)
};

RuntimeInfo runtime_info();

// "2.11.0": the LibTorch version (what the fingerprint compares across ranks).
std::string torch_version();

// "vlmtrain 0.2.0 (torch 2.11.0, CUDA 13.0, cuDNN 9.19.0, NCCL 2.28.9, 1 GPU)"
std::string version_line(const RuntimeInfo& info);

}  // namespace vlm
