// The trainer's checkpoint saving, synchronous or asynchronous (checkpoint.async).
//
// Synchronous: save() runs CheckpointWrite's three phases (checkpoint.h) in a row; the step
// loop waits for the files.
//
// Asynchronous: save() runs the collective begin phase on the training thread (rank 0
// prepares the temp directory; each rank copies its StateSlices and RNG states into host
// memory, which the optimizer no longer touches), starts the write on a thread of its own,
// and returns: training goes on while the files are written and fsynced. The collective
// commit (the "ok" all-reduce, COMPLETE) also runs on the training thread, at points that
// are the same on every rank, because Gloo collectives on one group must be issued in the
// same order everywhere (docs/design.md, invariant 3): the writing thread issues none.
//   - poll(), called by the trainer at every step end: while a write is pending, one
//     all-reduce of "my write is done" on the control plane; when every rank's is done,
//     the commit follows at once, on every rank alike (they all saw the same sum).
//   - save() of the next checkpoint waits for the pending one first (one in flight at most);
//   - finish() (end of training, stop on SIGINT / SIGTERM) waits for it and commits.
// Whether a write is pending is the same on every rank (saves and commits are collective
// and happen at the same steps), so every rank issues the same all-reduces. A crash, kill
// or error before the commit leaves that checkpoint without COMPLETE (its temp directory
// .step-<N>.tmp) and the previous complete one untouched. The waits are polls (an
// all-reduce every 50 ms), so a slow rank's write never holds the others inside one
// collective long enough to reach dist.timeout_s.
//
// What is not overlapped: the snapshot itself (state_slices(): on CUDA non-blocking device ->
// host copies into pinned memory, then one device sync) and the commit's two all-reduces and rank 0's small
// files. The snapshot doubles this rank's share of the optimizer state in host memory
// while a write is in flight.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "app/train/checkpoint.h"

namespace vlm::app {

struct CheckpointerOptions {
  std::string output_dir;
  CheckpointFiles files;
  int64_t keep_last = 0;              // > 0: prune older complete checkpoints at each commit
  bool async = false;                 // checkpoint.async
  torch::Device device = torch::kCPU;  // the rank's device (its RNG state is saved too)
  bool log = false;                   // log each save and commit (rank 0)
};

// A checkpoint that became complete (COMPLETE written, agreed by every rank).
struct CommittedCheckpoint {
  std::string dir;
  int64_t step = 0;           // the step it holds
  double seconds = 0;         // from the start of save() to COMPLETE
};

class Checkpointer {
 public:
  // `model` and `comm` (the control plane) must outlive the checkpointer.
  Checkpointer(CheckpointerOptions options, const vlm::sharding::ShardedModel& model,
               vlm::sharding::Comm& comm);
  // Waits for a write in flight; no collective, so that checkpoint stays incomplete.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective. Saves the model's state and `state` as step-<state.step>; `why` is for the
  // log. Sync: returns the committed checkpoint. Async: finishes a pending save first, takes
  // the snapshot, starts the write and returns nullopt (poll / finish commit it).
  std::optional<CommittedCheckpoint> save(const TrainerState& state, const std::string& why);
  // Collective when a write is pending (a no-op otherwise, on every rank alike): commits it
  // when every rank's write is done. `step`: the trainer's step now, for the log.
  std::optional<CommittedCheckpoint> poll(int64_t step);
  // Collective when a write is pending: waits for every rank's write and commits it.
  std::optional<CommittedCheckpoint> finish(const std::string& when);

  bool pending() const { return pending_ != nullptr; }
  // Seconds the last save() blocked the training thread (sync: the whole save; async: the
  // wait for a previous write, the begin phase and the snapshot).
  double last_blocking_seconds() const { return last_blocking_s_; }

 private:
  bool all_written();  // collective: one all-reduce of this rank's "done"
  CommittedCheckpoint commit(const std::string& when);

  CheckpointerOptions o_;
  const vlm::sharding::ShardedModel& model_;
  vlm::sharding::Comm& comm_;
  std::unique_ptr<CheckpointWrite> pending_;  // async: the save whose write runs on writing_
  std::future<void> writing_;
  std::chrono::steady_clock::time_point started_;
  double last_blocking_s_ = 0;
};

}  // namespace vlm::app
