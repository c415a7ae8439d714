// TensorMemoryMeter (vlm/runtime/tensor_memory.h): counts CPU tensor storage exactly, peaks, and
// sees the storage an FSDP-style release / refill gives back and takes again.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/core/CPUAllocator.h>

#include "vlm/runtime/tensor_memory.h"

namespace {

TEST(TensorMemoryMeter, CountsStorageBytesAndPeak) {
  vlm::TensorMemoryMeter::install();
  ASSERT_TRUE(vlm::TensorMemoryMeter::installed());
  const int64_t base = vlm::TensorMemoryMeter::live_bytes();
  vlm::TensorMemoryMeter::reset_peak();
  {
    torch::Tensor a = torch::empty({1 << 18}, torch::kFloat32);  // 1 MiB
    EXPECT_EQ(vlm::TensorMemoryMeter::live_bytes() - base, 1 << 20);
    {
      torch::Tensor b = torch::zeros({1000}, torch::kBFloat16);  // 2000 B
      torch::Tensor view = a.narrow(0, 0, 10);                   // no storage of its own
      EXPECT_EQ(vlm::TensorMemoryMeter::live_bytes() - base, (1 << 20) + 2000);
    }
    EXPECT_EQ(vlm::TensorMemoryMeter::live_bytes() - base, 1 << 20);
    EXPECT_EQ(vlm::TensorMemoryMeter::peak_bytes() - base, (1 << 20) + 2000);
    // An op's temporaries count while alive: a + a allocates its result.
    torch::Tensor c = a + a;
    EXPECT_EQ(vlm::TensorMemoryMeter::live_bytes() - base, 2 << 20);
  }
  EXPECT_EQ(vlm::TensorMemoryMeter::live_bytes(), base);
  vlm::TensorMemoryMeter::reset_peak();
  EXPECT_EQ(vlm::TensorMemoryMeter::peak_bytes(), base);
  // raw_allocate (used inside LibTorch) goes through the same counts.
  c10::Allocator* alloc = c10::GetCPUAllocator();
  void* p = alloc->raw_allocate(4096);
  EXPECT_EQ(vlm::TensorMemoryMeter::live_bytes() - base, 4096);
  alloc->raw_deallocate(p);
  EXPECT_EQ(vlm::TensorMemoryMeter::live_bytes(), base);
}

}  // namespace
