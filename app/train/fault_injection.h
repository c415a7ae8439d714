// Fault injection for the tests of the trainer's failure paths (tests/app/train/
// train_faults_dist_test.cpp, train_resume_dist_test.cpp, the launcher's restart tests).
// Both hooks read their environment variable at each call and do nothing when it is unset
// or empty, so a normal run pays one getenv per step.
//
//   VLMTRAIN_FAULT_NONFINITE="STEP[:RANK]"  the loss of step STEP (1-based) becomes NaN on
//                                           RANK (default 0) before backward, so its
//                                           gradients are NaN (the non-finite guard's test)
//   VLMTRAIN_FAULT_EXIT="STEP[:RANK]"       RANK (default 0) dies abruptly (_exit(3), no
//                                           cleanup) before step STEP, in the launcher's
//                                           first attempt only (TORCHELASTIC_RESTART_COUNT
//                                           unset or 0), to test restarts
#pragma once
#include <cstdint>

namespace vlm::app {

// True when VLMTRAIN_FAULT_NONFINITE names this step (1-based) and rank.
bool inject_nonfinite(int64_t step, int rank);

// Exits the process with status 3 (after one line on stderr) when VLMTRAIN_FAULT_EXIT names
// this step (1-based) and rank and this is the launcher's first attempt; returns otherwise.
void maybe_fault_exit(int64_t step, int rank);

}  // namespace vlm::app
