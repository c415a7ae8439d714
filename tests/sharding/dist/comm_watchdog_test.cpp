// CommWatchdog (sharding/dist/comm_watchdog.h) on scripted c10d works, no processes: an op that
// completes is dropped, one that does not is reported once its timeout passes, one that
// completes with an error is reported at once with that error.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "sharding/dist/comm_watchdog.h"

using namespace vlm::sharding;
using namespace std::chrono_literals;

namespace {

// A work whose state the test sets.
class ScriptedWork : public c10d::Work {
 public:
  std::atomic<bool> done{false};
  std::exception_ptr error;
  bool isCompleted() override { return done.load(); }
  std::exception_ptr exception() const override { return error; }
};

struct Fired {
  std::promise<std::string> report;
  std::atomic<int> calls{0};
};

std::unique_ptr<CommWatchdog> make_watchdog(std::chrono::milliseconds timeout, Fired& fired) {
  return std::make_unique<CommWatchdog>(
      timeout, 10ms,
      [](uint64_t seq, const std::string& head, const std::string& reason) {
        return "op #" + std::to_string(seq) + " " + head + ": " + reason;
      },
      [&fired](const std::string& report) {
        if (fired.calls++ == 0) fired.report.set_value(report);
      });
}

}  // namespace

TEST(CommWatchdog, CompletedOpsAreDroppedAndAStuckOneIsReportedAfterTheTimeout) {
  Fired fired;
  auto dog = make_watchdog(300ms, fired);
  auto ok = c10::make_intrusive<ScriptedWork>();
  auto stuck = c10::make_intrusive<ScriptedWork>();
  const auto t0 = std::chrono::steady_clock::now();
  dog->track(1, "all_reduce #1 (context: fine)", {ok});
  dog->track(2, "all_gather #2 (context: unit model.layers.3)", {stuck});
  ok->done = true;
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(dog->in_flight(), 1u);  // #1 dropped, #2 still within its timeout
  EXPECT_EQ(fired.calls.load(), 0);
  auto f = fired.report.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready) << "the stuck op was never reported";
  const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string report = f.get();
  EXPECT_GE(after, 0.3);
  EXPECT_NE(report.find("op #2 all_gather #2 (context: unit model.layers.3)"), std::string::npos) << report;
  EXPECT_NE(report.find("Timed out"), std::string::npos) << report;
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(fired.calls.load(), 1);  // reported once, then the watchdog stopped
}

TEST(CommWatchdog, AnOpThatFailedIsReportedWithItsError) {
  Fired fired;
  auto dog = make_watchdog(60s, fired);
  auto failed = c10::make_intrusive<ScriptedWork>();
  failed->error = std::make_exception_ptr(std::runtime_error("Connection closed by peer [127.0.0.1]:1234"));
  failed->done = true;
  dog->track(7, "reduce_scatter #7 (context: step 3)", {c10::make_intrusive<ScriptedWork>(), failed});
  auto f = fired.report.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_NE(f.get().find("reduce_scatter #7 (context: step 3): Connection closed by peer"), std::string::npos);
}
