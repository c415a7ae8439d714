// The plan's GPU facts. MFU's denominator: the data-sheet dense peak of the rank's GPU by
// the name CUDA reports, per matmul dtype (app/plan/flop_model.h gpu_peak_tflops), and the
// environment override; expected values from NVIDIA's data sheets (dense = half the "with
// sparsity" figure). The cuBLAS workspace term of the step plan (app/plan/step_memory.h):
// PyTorch's defaults and CUBLAS_WORKSPACE_CONFIG's format, the cuBLASLt one beside it, and
// two pairs of them in a training step on CUDA (the forward's thread and autograd's device
// thread each hold a pair: measured on an H200, 3 or 4 workspaces, 65-66 MiB, where a plan of
// one cuBLAS workspace came out 25-30 MiB under the measured peak), none on the CPU.
#include <gtest/gtest.h>

#include <cstdlib>

#include "app/plan/flop_model.h"
#include "app/plan/memory_plan.h"
#include "app/plan/step_memory.h"
#include "sharding/parallel/policy.h"
#include "vlm/model/config.h"
#include "vlm/model/vision_language_model.h"

namespace {

using vlm::app::gpu_peak_tflops;

TEST(GpuPeak, DataSheetPeaksByNameAndDtype) {
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA H100 80GB HBM3", torch::kBFloat16), 989.4);  // SXM5
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA H100 80GB HBM3", torch::kHalf), 989.4);
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA H100 80GB HBM3", torch::kFloat32), 66.9);
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA H100 PCIe", torch::kBFloat16), 756.5);
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA H100 NVL", torch::kBFloat16), 835.5);
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA H200", torch::kBFloat16), 989.4);
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA H200 NVL", torch::kBFloat16), 835.5);
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA A100-SXM4-80GB", torch::kBFloat16), 312.0);
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA A100 80GB PCIe", torch::kFloat32), 19.5);
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA B200", torch::kBFloat16), 2250.0);
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA L40S", torch::kBFloat16), 362.05);
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA GeForce RTX 4090", torch::kBFloat16), 0.0);  // not in the table
  EXPECT_DOUBLE_EQ(gpu_peak_tflops("NVIDIA H100 80GB HBM3", torch::kFloat64), 0.0);
}

TEST(GpuPeak, EnvironmentOverrides) {
  const char* before = std::getenv("VLMTRAIN_PEAK_TFLOPS");
  const std::string saved = before ? before : "";
  ::setenv("VLMTRAIN_PEAK_TFLOPS", "123.5", 1);
  std::string how;
  EXPECT_DOUBLE_EQ(vlm::app::peak_flops_per_rank(torch::kCPU, torch::kFloat32, &how), 123.5e12);
  EXPECT_NE(how.find("VLMTRAIN_PEAK_TFLOPS"), std::string::npos) << how;
  ::unsetenv("VLMTRAIN_PEAK_TFLOPS");
  EXPECT_GT(vlm::app::peak_flops_per_rank(torch::kCPU, torch::kFloat32, &how), 0.0);
  EXPECT_NE(how.find("theoretical fp32 peak"), std::string::npos) << how;
  if (before) ::setenv("VLMTRAIN_PEAK_TFLOPS", saved.c_str(), 1);
}

TEST(CublasWorkspace, DefaultsAndConfig) {
  const char* before = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  const std::string saved = before ? before : "";
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  EXPECT_DOUBLE_EQ(vlm::app::cublas_workspace_bytes(9), 32.0 * 1024 * 1024);   // Hopper: 4096 KiB x 8
  EXPECT_DOUBLE_EQ(vlm::app::cublas_workspace_bytes(10), 32.0 * 1024 * 1024);  // Blackwell
  EXPECT_DOUBLE_EQ(vlm::app::cublas_workspace_bytes(8), 8.125 * 1024 * 1024);   // Ampere: 4096x2 + 16x8 KiB
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8", 1);
  EXPECT_DOUBLE_EQ(vlm::app::cublas_workspace_bytes(9), 8.125 * 1024 * 1024);
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);  // the deterministic-mode setting
  EXPECT_DOUBLE_EQ(vlm::app::cublas_workspace_bytes(9), 128.0 * 1024);
  if (before) ::setenv("CUBLAS_WORKSPACE_CONFIG", saved.c_str(), 1); else ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
}

TEST(CublasWorkspace, CublasLtDefaultsAndConfig) {
  ::unsetenv("CUBLASLT_WORKSPACE_SIZE");
  ::unsetenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE");
  EXPECT_DOUBLE_EQ(vlm::app::cublaslt_workspace_bytes(), 1024.0 * 1024);  // 1024 KiB
  ::setenv("CUBLASLT_WORKSPACE_SIZE", "32768", 1);
  EXPECT_DOUBLE_EQ(vlm::app::cublaslt_workspace_bytes(), 32.0 * 1024 * 1024);
  ::setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "1", 1);
  EXPECT_DOUBLE_EQ(vlm::app::cublaslt_workspace_bytes(), 0.0);
  ::unsetenv("CUBLASLT_WORKSPACE_SIZE");
  ::unsetenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE");
}

TEST(CublasWorkspace, TrainingStepOnCudaCountsTwoPairs) {
  const char* before = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  const std::string saved = before ? before : "";
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  ::unsetenv("CUBLASLT_WORKSPACE_SIZE");
  ::unsetenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE");
  vlm::VisionLanguageModel model(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
  const vlm::sharding::ShardingOptions o;
  const auto units = vlm::sharding::resolve_units(*model, o);
  const vlm::app::MemoryPlan plan = vlm::app::plan_memory(units, 1, torch::kFloat32);
  vlm::app::MicroBatchShape shape;
  shape.rows = 1;
  shape.seq_len = 64;
  shape.patches = 16;
  shape.loss_rows = 32;
  const vlm::app::StepMemoryModel cuda(*model, plan, units, torch::kFloat32, vlm::app::AttentionPath::cuda, 0);
  const vlm::app::StepMemoryModel cpu(*model, plan, units, torch::kFloat32, vlm::app::AttentionPath::cpu, 0);
  const vlm::app::StepMemory on_cuda = cuda.step(shape, 1, 1), on_cpu = cpu.step(shape, 1, 1);
  EXPECT_DOUBLE_EQ(on_cuda.workspace, 2 * (32.0 + 1.0) * 1024 * 1024);  // H200: 65-66 MiB measured
  EXPECT_DOUBLE_EQ(on_cpu.workspace, 0.0);
  if (before) ::setenv("CUBLAS_WORKSPACE_CONFIG", saved.c_str(), 1);
}

}  // namespace
