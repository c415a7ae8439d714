// Tensor memory meter (see tensor_memory.h).
#include "vlm/runtime/tensor_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <mutex>

namespace vlm {

namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void add(int64_t n) {
  const int64_t now = g_live.fetch_add(n) + n;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

// Memory from c10::alloc_cpu (LibTorch's own aligned allocation) with a 64-byte header in
// front that keeps the size (data pointer == context, so raw_allocate works too).
constexpr size_t kHeader = 64;  // keeps alloc_cpu's 64-byte alignment

void counted_free(void* data) {
  if (data == nullptr) return;
  char* raw = static_cast<char*>(data) - kHeader;
  g_live.fetch_sub(*reinterpret_cast<int64_t*>(raw));
  c10::free_cpu(raw);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &counted_free, c10::Device(c10::kCPU)};
    char* raw = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    *reinterpret_cast<int64_t*>(raw) = static_cast<int64_t>(n);
    add(static_cast<int64_t>(n));
    void* data = raw + kHeader;
    return {data, data, &counted_free, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

std::once_flag g_once;
bool g_installed = false;

}  // namespace

void TensorMemoryMeter::install() {
  std::call_once(g_once, [] {
    static CountingAllocator counting;
    c10::SetCPUAllocator(&counting, /*priority=*/100);
    g_installed = true;
  });
}

bool TensorMemoryMeter::installed() { return g_installed; }
int64_t TensorMemoryMeter::live_bytes() { return g_live.load(); }
int64_t TensorMemoryMeter::peak_bytes() { return g_peak.load(); }
void TensorMemoryMeter::reset_peak() { g_peak.store(g_live.load()); }

}  // namespace vlm
