// Loader: output order equals the item order whatever the thread timing (1 and 4
// workers), bounded prefetch, worker errors surface with the item's description, early
// destruction joins cleanly; record image loading; a worker's ATen ops run on one
// intra-op thread while the consumer keeps its own count.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <opencv2/imgcodecs.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <filesystem>
#include <set>
#include <thread>

#include "data/image.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"

namespace {

using namespace vlm::data;

struct Item {
  int64_t index;
  std::string text;
};

// Deterministic but uneven per-item delay, so completion order differs from item order.
void jitter(int64_t i) {
  uint64_t s = mix_seed(42, uint64_t(i));
  std::this_thread::sleep_for(std::chrono::microseconds(uniform_below(3000, s)));
}

std::vector<int64_t> items() {
  std::vector<int64_t> v(60);
  for (int64_t i = 0; i < 60; ++i) v[i] = (i * 37) % 101;  // arbitrary sampler-like indices
  return v;
}

std::vector<Item> drain(int64_t workers, int64_t prefetch, std::atomic<int64_t>* max_ahead = nullptr) {
  std::atomic<int64_t> produced{0}, consumed{0};
  OrderedLoader<Item> loader(items(), [&](int64_t i) {
    jitter(i);
    int64_t p = ++produced;
    if (max_ahead) {
      int64_t ahead = p - consumed.load();
      int64_t cur = max_ahead->load();
      while (ahead > cur && !max_ahead->compare_exchange_weak(cur, ahead)) {}
    }
    return Item{i, "item" + std::to_string(i)};
  }, LoaderOptions{workers, prefetch});
  std::vector<Item> out;
  while (auto it = loader.next()) {
    out.push_back(std::move(*it));
    ++consumed;
  }
  return out;
}

TEST(Loader, DeterministicOrderWithOneAndFourWorkers) {
  const std::vector<int64_t> want = items();
  for (int64_t workers : {0, 1, 4}) {
    std::vector<Item> got = drain(workers, 6);
    ASSERT_EQ(got.size(), want.size()) << workers;
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(got[k].index, want[k]) << "workers=" << workers << " pos " << k;
      EXPECT_EQ(got[k].text, "item" + std::to_string(want[k]));
    }
  }
}

// Threads of this process now (/proc/self/task entries).
int64_t process_threads() {
  int64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory();
  return n;
}

// Threads an elementwise op on 4M floats adds to the process: a thread whose ATen ops may use
// 2 intra-op threads starts an OpenMP team of its own (one more thread, kept while it lives).
int64_t threads_added_by_an_aten_op() {
  const int64_t before = process_threads();
  torch::Tensor y = torch::ones({1 << 22}) * 3.0f;
  const int64_t after = process_threads();
  EXPECT_EQ(y[5].item<float>(), 3.0f);
  return after - before;
}

TEST(Loader, WorkersRunAtenOnOneIntraOpThread) {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  // The check has teeth: a plain thread's first op starts a team of 2.
  int64_t added = -1;
  std::thread([&] { added = threads_added_by_an_aten_op(); }).join();
  ASSERT_EQ(added, 1) << "a plain thread should start an OpenMP team of its own";
  // One worker: while it produces, the consumer waits and no other thread starts.
  OrderedLoader<std::pair<int64_t, int64_t>> loader(std::vector<int64_t>{0, 1, 2}, [](int64_t) {
    return std::make_pair(int64_t(at::get_num_threads()), threads_added_by_an_aten_op());
  }, LoaderOptions{1, 1});
  while (auto r = loader.next()) {
    EXPECT_EQ(r->first, 1) << "intra-op threads seen by a loader worker";
    EXPECT_EQ(r->second, 0) << "threads a loader worker's ATen op started";
  }
  EXPECT_EQ(at::get_num_threads(), 2);  // the consumer's setting is untouched
  at::set_num_threads(before);
}

TEST(Loader, PrefetchIsBounded) {
  std::atomic<int64_t> max_ahead{0};
  drain(4, 3, &max_ahead);
  // At most `prefetch` items are produced beyond what was consumed (+1 for the item the
  // consumer is taking while a worker finishes).
  EXPECT_LE(max_ahead.load(), 4);
}

TEST(Loader, WorkerErrorSurfacesInOrderWithDescription) {
  for (int64_t workers : {0, 1, 4}) {
    OrderedLoader<int64_t> loader(
        {0, 1, 2, 3, 4, 5, 6, 7},
        [](int64_t i) -> int64_t {
          jitter(i);
          if (i == 5) throw vlm::Error("cannot decode image 'x.png'");
          return i;
        },
        LoaderOptions{workers, 4}, [](int64_t i) { return "data.jsonl:" + std::to_string(i + 1); });
    for (int64_t i = 0; i < 5; ++i) {
      auto v = loader.next();
      ASSERT_TRUE(v.has_value());
      EXPECT_EQ(*v, i);
    }
    try {
      loader.next();
      ADD_FAILURE() << "expected the worker's error";
    } catch (const vlm::Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("data.jsonl:6"), std::string::npos) << msg;
      EXPECT_NE(msg.find("x.png"), std::string::npos) << msg;
    }
  }
}

TEST(Loader, EarlyDestructionJoins) {
  std::vector<int64_t> many(1000);
  for (int64_t i = 0; i < 1000; ++i) many[i] = i;
  auto t0 = std::chrono::steady_clock::now();
  {
    OrderedLoader<int64_t> loader(many, [](int64_t i) { jitter(i); return i; }, LoaderOptions{4, 8});
    EXPECT_EQ(*loader.next(), 0);
    EXPECT_EQ(*loader.next(), 1);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(Loader, RecordImages) {
  vlm::test::TempDir dir("loader");
  cv::Mat a(60, 90, CV_8UC3), b(30, 30, CV_8UC3);
  cv::randu(a, 0, 255);
  cv::randu(b, 0, 255);
  ASSERT_TRUE(cv::imwrite(dir / "a.png", a));
  ASSERT_TRUE(cv::imwrite(dir / "b.png", b));
  Record r;
  r.source = "set.jsonl";
  r.line = 3;
  r.images = {{dir / "a.png", 90, 60}, {dir / "b.png", 30, 30}};
  PixelConfig cfg;
  RecordImages got = load_record_images(r, cfg);
  PixelImage ea = process_image(decode_image_rgb(dir / "a.png"), cfg);
  PixelImage eb = process_image(decode_image_rgb(dir / "b.png"), cfg);
  ASSERT_EQ(got.pixel_values.size(0), ea.pixel_values.size(0) + eb.pixel_values.size(0));
  EXPECT_TRUE(torch::equal(got.pixel_values, torch::cat({ea.pixel_values, eb.pixel_values})));
  std::vector<int64_t> thw(got.grid_thw.data_ptr<int64_t>(), got.grid_thw.data_ptr<int64_t>() + 6);
  EXPECT_EQ(thw, (std::vector<int64_t>{1, ea.grid_thw[1], ea.grid_thw[2], 1, eb.grid_thw[1], eb.grid_thw[2]}));
  // Budgets from the step plan are honoured.
  RecordImages small = load_record_images(r, cfg, {{28, 56}, {28, 28}});
  EXPECT_EQ(small.pixel_values.size(0), 8 + 4);
  // A missing image names the record's file:line.
  r.images[1].path = dir / "gone.png";
  try {
    load_record_images(r, cfg);
    ADD_FAILURE() << "expected an error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("set.jsonl:3"), std::string::npos) << e.what();
  }
  Record text_only;
  EXPECT_EQ(load_record_images(text_only, cfg).pixel_values.size(0), 0);
}

}  // namespace
