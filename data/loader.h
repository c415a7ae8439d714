// Prefetching loader: worker threads run `produce(i)` for i in a fixed list of work items
// and the consumer receives the results strictly in list order, whatever the thread
// timing. A bounded window (prefetch) limits how far workers run ahead. Errors thrown in
// a worker are re-thrown in the consumer thread when their item is reached (wrapped with
// the item's description, e.g. the record's file:line). The destructor stops and joins
// the workers (clean shutdown also when the consumer stops early).
//
// The unit of work is generic so the trainer can plug in "decode + resize to the budget
// collate chose + tokenize"; load_record_images() is the image part of that.
//
// Each worker thread runs its ATen ops on one intra-op thread (use_one_intra_op_thread):
// a worker is one core's worth of loading, and a second OpenMP team next to the training
// step's makes libgomp stop spinning its idle workers at every fork/join of the step
// (more threads managed than CPUs), which cost the step 10-15% on 2 cores (issue #30,
// bench/notes/profile_step.md).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/pixel_pipeline.h"
#include "vlm/runtime/check.h"

namespace vlm::data {

// Makes ATen ops called from this thread run on one thread (no OpenMP team of their own);
// other threads keep their setting. Call at a thread's start.
void use_one_intra_op_thread();

struct LoaderOptions {
  int64_t workers = 2;    // 0: produce on the consumer thread (no threads)
  int64_t prefetch = 8;   // max items produced but not yet consumed (>= 1)
};

template <typename T>
class OrderedLoader {
 public:
  using Produce = std::function<T(int64_t item)>;
  using Describe = std::function<std::string(int64_t item)>;  // for error messages

  OrderedLoader(std::vector<int64_t> items, Produce produce, LoaderOptions opts = {},
                Describe describe = {})
      : items_(std::move(items)), produce_(std::move(produce)), describe_(std::move(describe)),
        opts_(opts) {
    VLM_CHECK(opts_.prefetch >= 1, "loader: prefetch must be >= 1, got ", opts_.prefetch);
    VLM_CHECK(opts_.workers >= 0, "loader: workers must be >= 0, got ", opts_.workers);
    for (int64_t w = 0; w < opts_.workers; ++w) threads_.emplace_back([this] { work(); });
  }
  OrderedLoader(const OrderedLoader&) = delete;
  OrderedLoader& operator=(const OrderedLoader&) = delete;

  ~OrderedLoader() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  int64_t size() const { return int64_t(items_.size()); }

  // Next result in list order; nullopt when all items were delivered. Re-throws a
  // worker's error as vlm::Error naming the item.
  std::optional<T> next() {
    if (next_out_ >= size()) return std::nullopt;
    const int64_t pos = next_out_++;
    if (opts_.workers == 0) return run(pos);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_.count(pos) > 0; });
    Slot slot = std::move(done_.at(pos));
    done_.erase(pos);
    consumed_ = pos + 1;
    lock.unlock();
    cv_.notify_all();  // a window slot opened
    if (slot.error) std::rethrow_exception(slot.error);
    return std::move(slot.value);
  }

 private:
  struct Slot {
    std::optional<T> value;
    std::exception_ptr error;
  };

  T run(int64_t pos) {
    try {
      return produce_(items_[size_t(pos)]);
    } catch (const std::exception& e) {
      const std::string what = describe_ ? describe_(items_[size_t(pos)])
                                         : vlm::str("item ", items_[size_t(pos)]);
      throw vlm::Error(vlm::str(what, ": ", e.what()));
    }
  }

  void work() {
    use_one_intra_op_thread();
    for (;;) {
      int64_t pos;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] {
          return stop_ || next_in_ >= size() || next_in_ < consumed_ + opts_.prefetch;
        });
        if (stop_ || next_in_ >= size()) return;
        pos = next_in_++;
      }
      Slot slot;
      try {
        slot.value.emplace(run(pos));
      } catch (...) {
        slot.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.emplace(pos, std::move(slot));
      }
      cv_.notify_all();
    }
  }

  std::vector<int64_t> items_;
  Produce produce_;
  Describe describe_;
  LoaderOptions opts_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, Slot> done_;   // produced, not yet consumed (by list position)
  int64_t next_in_ = 0;            // next list position a worker will take
  int64_t consumed_ = 0;           // list positions delivered so far
  int64_t next_out_ = 0;           // consumer's next position (consumer thread only)
  bool stop_ = false;
};

// The images of one record, decoded and processed.
struct RecordImages {
  std::vector<PixelImage> images;  // one per record image, in order
  torch::Tensor pixel_values;      // [sum patches, C*T*p*p] concatenated (empty when no image)
  torch::Tensor grid_thw;          // [n_images, 3] int64
};

// Decodes and processes every image of `record`. `targets` (optional) gives each image's
// resized size as chosen by the step plan; otherwise smart_resize under cfg. Errors name
// record.location() and the image path.
RecordImages load_record_images(const Record& record, const PixelConfig& cfg,
                                const std::vector<vlm::ImageSize>& targets = {});

}  // namespace vlm::data
