// The trainer's fault-injection hooks (contract in fault_injection.h).
#include "app/train/fault_injection.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace vlm::app {
namespace {

// "STEP[:RANK]" -> (STEP, RANK), RANK 0 when absent.
struct FaultSpec {
  int64_t step = 0;
  int rank = 0;
};
FaultSpec parse_fault_spec(const std::string& s) {
  const size_t colon = s.find(':');
  FaultSpec f;
  f.step = std::stoll(s.substr(0, colon));
  f.rank = colon == std::string::npos ? 0 : std::stoi(s.substr(colon + 1));
  return f;
}

}  // namespace

bool inject_nonfinite(int64_t step, int rank) {
  const char* env = std::getenv("VLMTRAIN_FAULT_NONFINITE");
  if (env == nullptr || *env == '\0') return false;
  const FaultSpec f = parse_fault_spec(env);
  return f.step == step && f.rank == rank;
}

void maybe_fault_exit(int64_t step, int rank) {
  const char* env = std::getenv("VLMTRAIN_FAULT_EXIT");
  if (env == nullptr || *env == '\0') return;
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (restart != nullptr && std::atoi(restart) != 0) return;
  const FaultSpec f = parse_fault_spec(env);
  if (f.step == step && f.rank == rank) {
    std::fprintf(stderr, "VLMTRAIN_FAULT_EXIT: rank %d exits before step %lld\n", rank, static_cast<long long>(step));
    std::fflush(stderr);
    ::_exit(3);
  }
}

}  // namespace vlm::app
