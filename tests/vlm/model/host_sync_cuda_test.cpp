// On a GPU, the training step's forward and backward never make the host wait: every tiny
// family, with images and text-only, runs forward + backward in bf16 under CUDA's sync debug
// mode set to error (c10::cuda::SyncDebugMode::L_ERROR: a synchronising call, such as a
// blocking copy, item() or nonzero, throws). The batch is moved to the device as the
// trainer's device context moves it (image_grid_thw and text_cu_seqlens stay on the host).
// host_sync_test.cpp guards the same code path on the CPU.
// Label cuda: skipped where no GPU is visible; the GPU run runs it.
#include <gtest/gtest.h>

#include <c10/cuda/CUDAFunctions.h>

#include "tests/vlm/model/host_sync_testing.h"
#include "vlm/model/meta_init.h"

namespace {

// Restores the sync debug mode on scope exit (also when the step throws).
struct SyncDebugError {
  c10::cuda::SyncDebugMode before = c10::cuda::warning_state().get_sync_debug_mode();
  SyncDebugError() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR); }
  ~SyncDebugError() { c10::cuda::warning_state().set_sync_debug_mode(before); }
};

vlm::Batch to_cuda(const vlm::Batch& host) {
  vlm::Batch b = host;
  for (torch::Tensor* t : {&b.input_ids, &b.attention_mask, &b.labels, &b.position_ids, &b.pixel_values,
                           &b.loss_rows, &b.image_rows})
    if (t->defined()) *t = t->to(torch::kCUDA);
  return b;
}

class HostSyncCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(HostSyncCuda, TrainingForwardAndBackwardDoNotSynchronise) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device visible to LibTorch (torch::cuda::is_available() is false); "
                    "the GPU run (scripts/gpu/device_run.sh) runs the cuda label on a lent GPU";
  vlm::VisionLanguageModel m(vlm::preset(GetParam()), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCUDA, torch::kBFloat16, 1});
  m->train();
  for (bool images : {true, false}) {
    SCOPED_TRACE(images ? "with images" : "text only");
    const vlm::Batch b = to_cuda(vlm::test::collate_like_batch(m->cfg, images));
    m->zero_grad();
    torch::cuda::synchronize();  // the set-up's copies are done before the guarded region
    torch::Tensor loss;
    try {
      SyncDebugError guard;
      auto out = m->forward(b);
      out.loss_sum.backward();
      loss = out.loss_sum.detach();
    } catch (const std::exception& e) {
      FAIL() << "a synchronising call in the step: " << e.what();
    }
    EXPECT_TRUE(std::isfinite(loss.item<float>()));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HostSyncCuda,
                         ::testing::Values("tiny", "tiny-qwen2.5", "tiny-qwen3", "tiny-qwen3.5"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& ch : s)
                             if (ch == '.' || ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
