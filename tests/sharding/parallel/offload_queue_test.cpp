// HostUpdateQueue (sharding/parallel/offload.h), the background thread of optimizer offload: tasks
// run in submission order on another thread; wait(ticket) returns once that task and every
// earlier one ran; an exception in a task is rethrown by the waits after it; the destructor
// runs what is still queued.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "sharding/parallel/offload.h"

namespace {

using vlm::sharding::HostUpdateQueue;

TEST(OffloadQueue, RunsInOrderOnAnotherThreadAndWaitsPerTicket) {
  HostUpdateQueue q;
  q.set_delay_for_testing(std::chrono::milliseconds(50));
  std::vector<int> order;
  std::atomic<bool> other_thread{true};
  const auto caller = std::this_thread::get_id();
  int64_t t1 = q.submit([&] { order.push_back(1); other_thread = other_thread && std::this_thread::get_id() != caller; });
  int64_t t2 = q.submit([&] { order.push_back(2); });
  int64_t t3 = q.submit([&] { order.push_back(3); });
  EXPECT_EQ(t1, 1);
  EXPECT_EQ(t3, 3);
  EXPECT_LT(q.finished(), 3) << "submit() must not run the task";
  q.wait(t2);
  EXPECT_GE(q.finished(), 2);
  q.wait_all();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(other_thread.load());
  q.wait(0);  // nothing to wait for
}

TEST(OffloadQueue, ExceptionIsRethrownByLaterWaits) {
  HostUpdateQueue q;
  bool after = false;
  q.submit([] { throw std::runtime_error("host update failed"); });
  const int64_t t = q.submit([&] { after = true; });
  EXPECT_THROW(q.wait(t), std::runtime_error);
  EXPECT_THROW(q.wait_all(), std::runtime_error);
  EXPECT_TRUE(after);  // later tasks still ran
}

TEST(OffloadQueue, DestructorRunsQueuedTasks) {
  std::atomic<int> ran{0};
  {
    HostUpdateQueue q;
    q.set_delay_for_testing(std::chrono::milliseconds(20));
    for (int i = 0; i < 5; ++i) q.submit([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 5);
}

}  // namespace
