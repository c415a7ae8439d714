// The trainer's checkpoint saving (contract in checkpointer.h).
#include "app/train/checkpointer.h"

#include <spdlog/spdlog.h>

#include <system_error>
#include <thread>
#include <utility>

#include "data/loader.h"
#include "vlm/runtime/check.h"
#include "sharding/dist/comm.h"

namespace vlm::app {
namespace {

double ckpt_seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

constexpr std::chrono::milliseconds kCheckpointPollEvery{50};

}  // namespace

Checkpointer::Checkpointer(CheckpointerOptions options, const vlm::sharding::ShardedModel& model,
                           vlm::sharding::Comm& comm)
    : o_(std::move(options)), model_(model), comm_(comm) {}

Checkpointer::~Checkpointer() {
  if (writing_.valid()) writing_.wait();
}

std::optional<CommittedCheckpoint> Checkpointer::save(const TrainerState& state, const std::string& why) {
  const auto t0 = std::chrono::steady_clock::now();
  if (pending_) finish("before the next save");  // one write in flight at most
  started_ = std::chrono::steady_clock::now();
  const double waited = ckpt_seconds_since(t0);
  auto w = std::make_unique<CheckpointWrite>(o_.output_dir, state, model_, comm_, o_.device);
  if (!o_.async) {
    w->write();
    CommittedCheckpoint c{w->commit(comm_, o_.files, o_.keep_last), state.step, ckpt_seconds_since(started_)};
    last_blocking_s_ = ckpt_seconds_since(t0);
    if (o_.log) spdlog::info("checkpoint ({}) {} in {:.2f} s", why, c.dir, c.seconds);
    return c;
  }
  CheckpointWrite* raw = w.get();
  const double mib = static_cast<double>(raw->snapshot_bytes()) / (1 << 20);  // before the writer shares it
  pending_ = std::move(w);
  try {
    writing_ = std::async(std::launch::async, [raw] {
      vlm::data::use_one_intra_op_thread();  // no second OpenMP team next to the step's
      raw->write();                          // never throws; commit() reports a failure
    });
  } catch (const std::system_error&) {  // no thread to be had: write here, commit as usual
    raw->write();
    std::promise<void> done;
    done.set_value();
    writing_ = done.get_future();
  }
  last_blocking_s_ = ckpt_seconds_since(t0);
  if (o_.log)
    spdlog::info("checkpoint ({}) {}: {:.1f} MiB copied to host in {:.2f} s{}, being written in the background", why,
                 raw->final_dir(), mib, ckpt_seconds_since(started_),
                 waited >= 0.01 ? fmt::format(" (after {:.2f} s waiting for the previous write)", waited) : "");
  return std::nullopt;
}

bool Checkpointer::all_written() {
  const bool mine = writing_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  torch::Tensor done = torch::tensor({mine ? 1.0 : 0.0}, torch::kFloat64);
  comm_.all_reduce(done, vlm::sharding::ReduceOp::kSum,
                   vlm::str("checkpoint: written step ", pending_->step(), " on every rank?"));
  return done.item<double>() == static_cast<double>(comm_.world_size());
}

std::optional<CommittedCheckpoint> Checkpointer::poll(int64_t step) {
  if (!pending_ || !all_written()) return std::nullopt;
  return commit(vlm::str("at the end of step ", step));
}

std::optional<CommittedCheckpoint> Checkpointer::finish(const std::string& when) {
  if (!pending_) return std::nullopt;
  // Every rank leaves the loop after the same all-reduce (they all see the same sum).
  do {
    writing_.wait_for(kCheckpointPollEvery);
  } while (!all_written());
  return commit(when);
}

CommittedCheckpoint Checkpointer::commit(const std::string& when) {
  writing_.get();  // done (all_written); rethrows nothing: write() never throws
  std::unique_ptr<CheckpointWrite> w = std::move(pending_);
  CommittedCheckpoint c{w->commit(comm_, o_.files, o_.keep_last), w->step(), ckpt_seconds_since(started_)};
  if (o_.log)
    spdlog::info("checkpoint {} complete: written in the background, committed {}, {:.2f} s after its save", c.dir,
                 when, c.seconds);
  return c;
}

}  // namespace vlm::app
