// CommWatchdog: ends a rank whose collective never completes, with the comm layer's report.
//
// On NCCL, Work::wait() only makes the current stream wait for the collective: the host
// goes on, and a peer that died (or never entered the op) shows up only at the next host
// sync, which then blocks inside the driver with no message. The watchdog is a thread that
// keeps the ops in flight (their c10d works, polled with isCompleted(), as ProcessGroupNCCL's
// own watchdog does) and, for an op that has not completed within the timeout or that
// completed with an error, builds the same report a failed wait() throws (Comm: op,
// context, both planes' flight recorders, the last op each peer entered) and hands it to
// the handler, which ends the process (ParallelDims::start_watchdog: log, error file,
// abort of the process group, exit 1). ParallelDims starts it on NCCL's data plane;
// nothing prevents starting it on Gloo (the tests do), where a blocking wait() usually
// reports first.
#pragma once
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace vlm::sharding {

class CommWatchdog {
 public:
  // The full report of op `seq` (whose one-line description is `head`) failing for `reason`.
  using Report = std::function<std::string(uint64_t seq, const std::string& head, const std::string& reason)>;
  // Gets the report; must not return (ends the process). If it returns, the watchdog stops.
  using Handler = std::function<void(const std::string& report)>;

  CommWatchdog(std::chrono::milliseconds timeout, std::chrono::milliseconds poll, Report report, Handler handler);
  ~CommWatchdog();  // stops and joins the thread
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  // Watches op `seq` until all of `works` report completion.
  void track(uint64_t seq, std::string head, std::vector<c10::intrusive_ptr<c10d::Work>> works);
  // Ops still watched.
  size_t in_flight() const;

 private:
  struct Entry {
    std::string head;
    std::chrono::steady_clock::time_point start;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
  };
  void run();
  // "" while the entry is fine or still within the timeout; else why it failed.
  std::string failure_of(const Entry& e, std::chrono::steady_clock::time_point now, bool* completed) const;

  std::chrono::milliseconds timeout_, poll_;
  Report report_;
  Handler handler_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Entry> entries_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace vlm::sharding
