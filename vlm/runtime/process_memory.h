// Host memory of this process as the kernel counts it: the resident set now and at its peak.
#pragma once
#include <cstdint>

namespace vlm {

// Peak resident set size of this process in bytes (getrusage; it can lag the current one).
int64_t peak_rss_bytes();
// Current resident set size in bytes (/proc/self/statm).
int64_t current_rss_bytes();

}  // namespace vlm
