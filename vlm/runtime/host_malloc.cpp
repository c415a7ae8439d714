#include "vlm/runtime/host_malloc.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace vlm {

namespace {

std::string& setting() {
  static std::string s;
  return s;
}

// The environment variable that already controls glibc malloc, or "".
std::string env_control() {
  const char* t = std::getenv("GLIBC_TUNABLES");
  if (t != nullptr && std::strstr(t, "glibc.malloc.") != nullptr) return "GLIBC_TUNABLES";
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
    if (std::getenv(v) != nullptr) return v;
  const char* own = std::getenv("VLMTRAIN_HOST_MALLOC");
  if (own != nullptr && std::strcmp(own, "system") == 0) return "VLMTRAIN_HOST_MALLOC=system";
  return "";
}

}  // namespace

std::string tune_host_malloc() {
#if defined(__GLIBC__)
  constexpr int kMmapThreshold = 32 << 20;  // glibc's maximum on 64-bit (4 MiB x sizeof(long))
  constexpr int kTrimThreshold = 1 << 30;
  const std::string env = env_control();
  if (!env.empty()) {
    setting() = "host malloc: glibc defaults or " + env + " (left to the environment)";
  } else if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1) {
    setting() = "host malloc: glibc keeps freed memory (mmap threshold 32 MiB, trim threshold 1 GiB; "
                "VLMTRAIN_HOST_MALLOC=system for the defaults)";
  } else {
    setting() = "host malloc: glibc refused the thresholds (defaults in effect)";
  }
#else
  setting() = "host malloc: system allocator (not glibc, left alone)";
#endif
  return setting();
}

std::string host_malloc_setting() { return setting(); }

}  // namespace vlm
