// CommWatchdog (see comm_watchdog.h).
#include "sharding/dist/comm_watchdog.h"

#include <exception>

#include "vlm/runtime/check.h"

namespace vlm::sharding {

CommWatchdog::CommWatchdog(std::chrono::milliseconds timeout, std::chrono::milliseconds poll, Report report,
                           Handler handler)
    : timeout_(timeout), poll_(poll), report_(std::move(report)), handler_(std::move(handler)) {
  VLM_CHECK(timeout_.count() > 0 && poll_.count() > 0, "comm watchdog: timeout and poll must be > 0");
  thread_ = std::thread([this] { run(); });
}

CommWatchdog::~CommWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CommWatchdog::track(uint64_t seq, std::string head, std::vector<c10::intrusive_ptr<c10d::Work>> works) {
  if (works.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  entries_[seq] = Entry{std::move(head), std::chrono::steady_clock::now(), std::move(works)};
}

size_t CommWatchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::string CommWatchdog::failure_of(const Entry& e, std::chrono::steady_clock::time_point now,
                                     bool* completed) const {
  *completed = true;
  for (const auto& w : e.works) {
    if (!w->isCompleted()) {
      *completed = false;
      continue;
    }
    if (std::exception_ptr ex = w->exception()) {
      try {
        std::rethrow_exception(ex);
      } catch (const c10::Error& err) {
        return err.what_without_backtrace();
      } catch (const std::exception& err) {
        return err.what();
      } catch (...) {
        return "the collective completed with an unknown error";
      }
    }
  }
  const double age = std::chrono::duration<double>(now - e.start).count();
  if (!*completed && now - e.start > timeout_)
    return str("not completed ", age, " s after it was issued (comm watchdog; on NCCL wait() only makes the ",
               "stream wait, so the host saw nothing: Timed out)");
  return "";
}

void CommWatchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, poll_, [this] { return stop_; });
    if (stop_) return;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = entries_.begin(); it != entries_.end();) {
      bool completed = false;
      const std::string reason = failure_of(it->second, now, &completed);
      if (reason.empty()) {
        it = completed ? entries_.erase(it) : std::next(it);
        continue;
      }
      const uint64_t seq = it->first;
      const std::string head = it->second.head;
      entries_.clear();
      lock.unlock();  // the report waits for the peers' reports through the store
      handler_(report_(seq, head, reason));
      return;  // a handler that returns stops the watchdog
    }
  }
}

}  // namespace vlm::sharding
