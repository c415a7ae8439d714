// Helpers shared by the libFuzzer targets in tests/fuzz (one <kind>_fuzz.cpp per input kind).
//
// The contract every target checks: bytes from a stranger may be rejected with vlm::Error
// (or the record-level BadRecordError of data/dataset.h), and nothing else may happen: no
// crash, no sanitizer report, no leak, no other exception type. A std::exception that is
// not a vlm::Error escapes the target on purpose, so libFuzzer reports it as a crash
// ("deadly signal" after std::terminate) and the parser gets fixed to throw vlm::Error.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

#include "vlm/runtime/check.h"

namespace vlm::fuzz {

// Runs `fn`, swallowing the one error type the input is allowed to cause.
template <typename Fn>
void expect_only_vlm_errors(Fn&& fn) {
  try {
    fn();
  } catch (const vlm::Error&) {
    // Rejected with a clear message: the expected outcome for bad input.
  }
}

// A private scratch directory for targets whose parser reads files, created once per
// process (libFuzzer runs every input in the same process) under $TMPDIR or /tmp.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/vlmfuzz.XXXXXX";
    if (!mkdtemp(templ.data())) std::abort();
    return templ;
  }();
  return dir;
}

inline void write_bytes(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) std::abort();
}

// Splits an input into two parts: byte 0 is the length (0..255) of the first part, which
// follows it; the second part is the rest. Seeds are written with join2().
inline std::pair<std::string_view, std::string_view> split2(const uint8_t* data, size_t size) {
  if (size == 0) return {};
  const auto* p = reinterpret_cast<const char*>(data);
  size_t first = std::min<size_t>(data[0], size - 1);
  return {std::string_view(p + 1, first), std::string_view(p + 1 + first, size - 1 - first)};
}

inline std::string join2(std::string_view first, std::string_view second) {
  std::string out(1, static_cast<char>(std::min<size_t>(first.size(), 255)));
  out += first.substr(0, 255);
  out += second;
  return out;
}

}  // namespace vlm::fuzz
