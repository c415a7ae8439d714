// The training data path of one rank: dataset -> text token counts -> sampler (one global
// order) -> step plan (collate) -> this rank's samples decoded and tokenized ahead of time
// by loader threads -> micro-batches.
//
//   TrainData data(recipe, tok, cfg, rank, world, barrier);
//   StepData s = data.next(cursor);      // this rank's micro-batches of that step
//   cursor = s.next;
//
// Every rank plans every step from global facts (the step's samples, their token counts
// and image sizes), so all ranks agree on the micro-batch count of every step without a
// collective (docs/design.md, invariants 1-2). A sample that fails to build on one rank (corrupt
// image, truncation inside an image) is dropped from its micro-batch with a warning; a
// micro-batch left empty becomes a filler; more failures than data.max_bad_fraction of the
// samples seen is an error. Neither changes any rank's number of micro-batches.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/config/recipe.h"
#include "collate/micro_batch.h"
#include "collate/step_plan.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/sample_builder.h"
#include "data/sampler.h"
#include "sharding/dist/device_context.h"
#include "vlm/model/config.h"
#include "vlm/text/tokenizer.h"

namespace vlm::app {

struct StepData {
  std::vector<vlm::collate::MicroBatch> micro_batches;  // same count on every rank
  vlm::data::SamplerCursor next;  // cursor after this step (same on every rank)
  int64_t samples = 0;            // real samples built on this rank
  int64_t images = 0;
  int64_t dropped = 0;            // samples that failed to build on this rank
  int64_t plan_skipped = 0;       // samples of the step that fit no budget (all ranks agree)
  int64_t padded = 0;             // padding repeats at the epoch's end (global)
  double wait_seconds = 0;        // time spent waiting for the loader
};

class TrainData {
 public:
  // barrier: called between rank 0's pass over the dataset (which writes the index
  // caches) and the other ranks' (which read them). `warn` receives data warnings.
  // cp: the ranks of a group that get the same samples (context / tensor parallelism: cp x tp
  // consecutive ranks); stages: pipeline parallelism's stages (world / stages consecutive ranks
  // each), whose ranks of the same index get the same samples. The sampler and the step plan
  // see world / (stages x cp) data-parallel ranks.
  TrainData(const Recipe& recipe, const vlm::Tokenizer& tok, const vlm::VlmConfig& cfg, int64_t rank,
            int64_t world, const std::function<void()>& barrier,
            std::function<void(const std::string&)> warn, int64_t cp = 1, int64_t stages = 1);
  ~TrainData();

  int64_t dataset_size() const { return static_cast<int64_t>(ds_.records.size()); }
  int64_t steps_per_epoch() const { return sampler_->steps_per_epoch(); }
  const vlm::data::Dataset& dataset() const { return ds_; }
  int64_t pad_token_id() const { return pad_id_; }

  // The step starting at `cursor`. Consecutive calls (cursor = previous next) stream from
  // the prefetching loader; any other cursor restarts it there.
  StepData next(const vlm::data::SamplerCursor& cursor);

 private:
  struct Produced;
  struct PlannedStep {
    vlm::data::SamplerCursor start, next;
    vlm::collate::RankPlan mine;
    int64_t plan_skipped = 0, padded = 0;
  };
  void plan_epoch(const vlm::data::SamplerCursor& from);
  Produced produce(int64_t item) const;

  const Recipe& recipe_;
  const vlm::Tokenizer& tok_;
  vlm::VlmConfig cfg_;
  int64_t rank_;                    // this process among all
  int64_t data_rank_, data_world_;  // its data-parallel group among all (rank / cp, world / cp)
  std::function<void(const std::string&)> warn_;
  vlm::data::Dataset ds_;
  std::vector<vlm::collate::SampleCost> costs_;
  std::unique_ptr<vlm::data::DistributedSampler> sampler_;
  vlm::collate::Budgets budgets_;
  vlm::data::PixelConfig pixels_;
  vlm::data::SampleOptions sample_opts_;
  int64_t pad_id_ = 0;
  // Rest of the current epoch from the cursor the loader started at.
  std::vector<PlannedStep> steps_;
  size_t next_step_ = 0;
  std::vector<const vlm::collate::PlannedSample*> items_;  // flattened samples of steps_
  std::unique_ptr<vlm::data::OrderedLoader<Produced>> loader_;
  int64_t built_ = 0, failed_ = 0;  // samples built / failed on this rank so far
};

// A step's micro-batches on the host (collate's) and on the device (the model's input).
struct StagedStep {
  StepData host;
  std::vector<vlm::Batch> device;
};

// The steps' micro-batches in order, copied to the device. take() returns the step that
// prefetch() staged, or reads it then; on CUDA, train_step calls prefetch(next cursor)
// while its kernels still run, so the next step's reads and host -> device copies overlap
// it. On CPU there is nothing to overlap, and waiting for the loader there would hold up
// the optimizer step. pixels false (a pipeline stage after the first, which never reads
// them): the device copies leave pixel_values out.
class StepFeed {
 public:
  StepFeed(TrainData& data, vlm::sharding::DeviceContext& device, bool pixels = true)
      : data_(data), device_(device), pixels_(pixels) {}
  StagedStep take(const vlm::data::SamplerCursor& cursor) {
    if (!staged_) prefetch(cursor);
    StagedStep s = std::move(*staged_);
    staged_.reset();
    return s;
  }
  void prefetch(const vlm::data::SamplerCursor& cursor) {
    StepData sd = data_.next(cursor);
    staged_ = std::make_unique<StagedStep>();
    for (const auto& mb : sd.micro_batches) {
      vlm::Batch b = mb.batch;
      if (!pixels_) b.pixel_values = torch::Tensor();
      staged_->device.push_back(device_.to_device(b));
    }
    staged_->host = std::move(sd);
  }

 private:
  TrainData& data_;
  vlm::sharding::DeviceContext& device_;
  bool pixels_;
  std::unique_ptr<StagedStep> staged_;
};

}  // namespace vlm::app
