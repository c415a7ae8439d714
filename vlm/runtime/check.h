// Error handling shared by every layer: throw, never exit.
//
//   VLM_CHECK(cond, "expected ", a, ", got ", b, " (hint: ...)");
//   throw vlm::Error(vlm::str("...", x));
//
// Messages say what was expected, what was found, and how to fix it. They are caught
// once, in app/cli/main.cpp, which prints them and returns a non-zero exit code.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace vlm {

// Error raised for bad input or misuse (not a bug in vlmtrain).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream ss;
  (ss << ... << args);
  return ss.str();
}

}  // namespace vlm

#define VLM_CHECK(cond, ...)                                                        \
  do {                                                                              \
    if (!(cond)) throw ::vlm::Error(::vlm::str(__VA_ARGS__));                       \
  } while (0)

// Internal invariant: a failure is a vlmtrain bug, so it carries file:line.
#define VLM_ASSERT(cond, ...)                                                       \
  do {                                                                              \
    if (!(cond))                                                                    \
      throw std::logic_error(::vlm::str(__FILE__, ":", __LINE__, ": internal error: ", \
                                        #cond, " ", ##__VA_ARGS__));                \
  } while (0)
