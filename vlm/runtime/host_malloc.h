// Host (CPU) allocator settings for a training process.
//
// By default glibc gives freed blocks of more than 128 KB back to the kernel (munmap, or
// trimming the top of the heap), so every training step page-faults fresh memory for its
// activations and, under FSDP, for each unit's gathered buffer and gradient buffer. On the
// small preset (bench/step_bench, CPU, fp32) that was 27k-40k minor page faults per step
// at world 1 and up to 103k per step and rank under full_shard at world 2, 0.05-0.35 s of
// system time per step of about one second.
//
// tune_host_malloc() makes glibc keep and reuse that memory: blocks below 32 MiB come from
// the heap (mmap threshold fixed at glibc's 64-bit maximum, which also stops its dynamic
// adjustment) and up to 1 GiB of free memory at the top of the heap is kept (trim
// threshold). Steady-state steps then fault almost nothing (about 1k faults per step); the
// price is an RSS that stays near its peak, as with PyTorch's CUDA caching allocator.
// Blocks of 32 MiB and more are still mapped and unmapped per use.
//
// Left alone when the environment already sets glibc's malloc knobs (GLIBC_TUNABLES with a
// glibc.malloc.* entry, MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) or when
// VLMTRAIN_HOST_MALLOC=system; a no-op on other C libraries.
#pragma once
#include <string>

namespace vlm {

// Call once at process start, before large allocations. Returns what was done, one line
// (also returned by host_malloc_setting() afterwards).
std::string tune_host_malloc();
std::string host_malloc_setting();  // "" before tune_host_malloc()

}  // namespace vlm
