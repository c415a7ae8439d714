// tune_host_malloc(): freed tensor memory is reused instead of being page-faulted afresh
// on every allocation. The control is the same loop under glibc's defaults, measured first
// in this process (mallopt is process-wide and one-way, so the tuned half runs second).
#include "vlm/host_malloc.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <cstdlib>

namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Minor page faults of `cycles` rounds of allocating, filling and freeing an 8 MiB tensor
// (a typical FSDP unit or activation size), after one round of warm-up.
long faults_of_alloc_cycles(int cycles) {
  auto round = [] {
    torch::Tensor t = torch::empty({2 << 20}, torch::kFloat32);  // 8 MiB
    t.fill_(1.0f);
    return t.sum().item<float>();
  };
  round();
  const long before = minor_faults();
  float sink = 0;
  for (int i = 0; i < cycles; ++i) sink += round();
  EXPECT_EQ(sink, static_cast<float>(cycles) * (2 << 20));
  return minor_faults() - before;
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
  const long pages = cycles * (8l << 20) / 4096;  // 16384 pages of 4 KiB
  const long before = faults_of_alloc_cycles(cycles);
  const std::string what = vlm::tune_host_malloc();
  EXPECT_NE(what.find("keeps freed memory"), std::string::npos) << what;
  EXPECT_EQ(vlm::host_malloc_setting(), what);
  const long after = faults_of_alloc_cycles(cycles);
  std::printf("minor page faults for %d alloc/fill/free cycles of 8 MiB (%ld pages): glibc defaults %ld, "
              "tuned %ld\n", cycles, pages, before, after);
  // glibc's defaults map 8 MiB blocks afresh or trim them back to the kernel, so their pages
  // fault again; how many depends on the process's allocation history (glibc's dynamic
  // mmap / trim thresholds): 2,048 to 16,384 of 16,384 measured on this project's machines
  // (November 2026), so the control is reported, not bounded. The tuned setting must keep
  // the memory: under 1/20 of the pages refault (0 measured), never more than the defaults.
  EXPECT_LT(after, pages / 20);
  EXPECT_LE(after, before);
  at::set_num_threads(threads);
#endif
}

TEST(HostMalloc, LeavesAnEnvironmentChoiceAlone) {
  ASSERT_EQ(setenv("VLM_HOST_MALLOC", "system", 1), 0);
  const std::string what = vlm::tune_host_malloc();
  unsetenv("VLM_HOST_MALLOC");
#if defined(__GLIBC__)
  EXPECT_NE(what.find("left to the environment"), std::string::npos) << what;
  EXPECT_NE(what.find("VLM_HOST_MALLOC=system"), std::string::npos) << what;
#endif
}

}  // namespace
