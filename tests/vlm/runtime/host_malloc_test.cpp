// tune_host_malloc(): freed tensor memory is reused instead of being page-faulted afresh
// on every allocation. The control is the same loop under glibc's defaults, measured first
// in this process (mallopt is process-wide and one-way, so the tuned half runs second).
#include "vlm/runtime/host_malloc.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Minor page faults of one round: allocate and fill six 8 MiB tensors at once (48 MiB live:
// a few FSDP units or activations), then free them.
long faults_of_round() {
  const long before = minor_faults();
  std::vector<torch::Tensor> live;
  float s = 0;
  for (int k = 0; k < 6; ++k) {
    live.push_back(torch::empty({2 << 20}, torch::kFloat32));  // 8 MiB
    live.back().fill_(1.0f);
    s += live.back().sum().item<float>();
  }
  EXPECT_EQ(s, 6.0f * (2 << 20));
  live.clear();
  return minor_faults() - before;
}

constexpr long kRoundPages = 6 * (8l << 20) / 4096;  // 12,288 pages of 4 KiB

// Minor page faults of four windows of `cycles` rounds each, after four warm-up rounds: the
// total (every window's count in *windows).
// Under glibc's defaults the 8 MiB blocks come from the heap once the dynamic mmap threshold
// has adapted, but the 48 MiB freed at the heap's top exceed the (dynamic, about 16 MiB) trim
// threshold and go back to the kernel now and then, so every window faults pages in again.
// Under the tuned setting the heap may still grow for a while (torch allocates with 64-byte
// alignment, so a freed block may not fit the next aligned request until the heap has room;
// how long that takes depends on the heap's layout and history, which differ between builds,
// environments and runs), then stays.
long faults_of_alloc_cycles(int cycles, std::vector<long>* windows) {
  for (int i = 0; i < 4; ++i) faults_of_round();
  long total = 0;
  for (int w = 0; w < 4; ++w) {
    long faults = 0;
    for (int i = 0; i < cycles; ++i) faults += faults_of_round();
    windows->push_back(faults);
    total += faults;
  }
  return total;
}

std::string joined(const std::vector<long>& v) {
  std::string s;
  for (long x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define VLM_SANITIZED_MALLOC 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define VLM_SANITIZED_MALLOC 1
#endif

TEST(HostMalloc, FreedMemoryIsReusedWithoutPageFaults) {
#if !defined(__GLIBC__) || defined(VLM_SANITIZED_MALLOC)
  GTEST_SKIP() << "tune_host_malloc() tunes glibc's malloc only (not a sanitizer's)";
#else
  ASSERT_EQ(std::getenv("GLIBC_TUNABLES"), nullptr) << "run this test without glibc malloc tunables";
  // One thread: no worker thread touches the pages or holds the main arena's lock (a
  // contended lock sends an allocation to another arena, whose heaps shrink on free), so
  // the counts measure the allocator setting, not the scheduling.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const int cycles = 8;
  const long pages = 4 * cycles * kRoundPages;  // 393,216 pages of 4 KiB over the four windows
  std::vector<long> win_before, win_after;
  const long before = faults_of_alloc_cycles(cycles, &win_before);
  const std::string what = vlm::tune_host_malloc();
  EXPECT_NE(what.find("keeps freed memory"), std::string::npos) << what;
  EXPECT_EQ(vlm::host_malloc_setting(), what);
  const long after = faults_of_alloc_cycles(cycles, &win_after);
  std::printf("minor page faults per window of %d alloc/fill/free cycles of 6 x 8 MiB (%ld pages in all four): "
              "glibc defaults %s; tuned %s\n",
              cycles, pages, joined(win_before).c_str(), joined(win_after).c_str());
  // glibc's defaults trim the freed 48 MiB back to the kernel (or map blocks afresh) until
  // their dynamic thresholds have adapted, so their pages fault again: 10,208 + 10,176 +
  // 14,272 + 0 of 393,216 measured here (November 2026); how many depends on the process's
  // allocation history, so the control is reported, not bounded. The tuned setting must keep
  // the memory: under 1/20 of the pages refault over the four windows (0 measured), never
  // more than under the defaults. (Measured once per window before: one window after a
  // fixed warm-up passed here and failed in CI with 6,145 faults, and under load here with
  // 10,240: whole 8 MiB blocks taken from fresh memory while the heap still grew.)
  EXPECT_LT(after, pages / 20);
  EXPECT_LE(after, before);
  at::set_num_threads(threads);
#endif
}

TEST(HostMalloc, LeavesAnEnvironmentChoiceAlone) {
  ASSERT_EQ(setenv("VLMTRAIN_HOST_MALLOC", "system", 1), 0);
  const std::string what = vlm::tune_host_malloc();
  unsetenv("VLMTRAIN_HOST_MALLOC");
#if defined(__GLIBC__)
  EXPECT_NE(what.find("left to the environment"), std::string::npos) << what;
  EXPECT_NE(what.find("VLMTRAIN_HOST_MALLOC=system"), std::string::npos) << what;
#endif
}

}  // namespace
