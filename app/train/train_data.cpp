// The training data path of one rank (see train_data.h).
#include "app/train/train_data.h"

#include <chrono>

#include "app/config/collate_options.h"
#include "app/config/data_options.h"
#include "app/report/progress.h"
#include "data/token_counts.h"
#include "vlm/runtime/check.h"

namespace vlm::app {

// One loaded sample, or why it could not be built.
struct TrainData::Produced {
  std::optional<vlm::TokenizedSample> sample;
  std::string failure;  // set when `sample` is empty
};

TrainData::TrainData(const Recipe& recipe, const vlm::Tokenizer& tok, const vlm::VlmConfig& cfg, int64_t rank,
                     int64_t world, const std::function<void()>& barrier,
                     std::function<void(const std::string&)> warn, int64_t cp, int64_t stages)
    : recipe_(recipe),
      tok_(tok),
      cfg_(cfg),
      rank_(rank),
      data_rank_(rank % (world / std::max<int64_t>(1, stages)) / cp),
      data_world_(world / std::max<int64_t>(1, stages) / cp),
      warn_(std::move(warn)) {
  VLM_CHECK(cp >= 1 && stages >= 1 && world % (cp * stages) == 0, "TrainData: cp = ", cp, " x stages = ", stages,
            " does not divide the world size ", world);
  const DataSection& d = recipe.data;
  VLM_CHECK(!d.train.empty(), recipe.location("data.train"),
            ": data.train is empty (expected one or more JSONL files; hint: --set data.train=FILE.jsonl)");
  vlm::data::DatasetOptions dopt = dataset_options(recipe);
  dopt.warn = rank == 0 ? warn_ : std::function<void(const std::string&)>([](const std::string&) {});
  if (rank == 0) dopt.on_index_progress = index_progress();
  sample_opts_ = sample_options(recipe, cfg);
  pixels_ = pixel_config(recipe, cfg);
  budgets_ = collate_budgets(recipe, pixels_);
  // Rank 0 first: it writes the index caches (image probes, token counts) the others read.
  std::vector<vlm::data::TextTokenCounts> counts;
  auto load = [&] {
    ds_ = vlm::data::load_dataset(d.train, dopt);
    counts = vlm::data::dataset_text_token_counts(ds_, tok, sample_opts_, true, nullptr, dopt.warn);
  };
  if (rank == 0) load();
  barrier();
  if (rank != 0) load();
  VLM_CHECK(!ds_.records.empty(), "data.train: no usable record in ", d.train.front(), " (", ds_.summary(), ")");

  costs_.resize(ds_.records.size());
  std::vector<int64_t> sampler_costs(ds_.records.size());
  for (size_t i = 0; i < ds_.records.size(); ++i) {
    vlm::collate::SampleCost& c = costs_[i];
    c.index = static_cast<int64_t>(i);
    c.text_tokens = counts[i].text_tokens;
    for (const auto& im : ds_.records[i].images) c.images.push_back({im.height, im.width});
    sampler_costs[i] = c.text_tokens;
  }
  vlm::data::SamplerOptions so;
  so.dataset_size = static_cast<int64_t>(ds_.records.size());
  so.world_size = data_world_;
  so.batch_per_rank = recipe.batch.samples_per_rank;
  so.seed = static_cast<uint64_t>(recipe.run.seed);
  so.shuffle = d.shuffle;
  so.group_by_length = d.group_by_length;
  if (d.group_by_length) so.costs = sampler_costs;
  sampler_ = std::make_unique<vlm::data::DistributedSampler>(so);

  std::optional<int64_t> pad = tok.token_to_id("<|endoftext|>");
  pad_id_ = pad ? *pad : cfg.eos_token_id;
}

TrainData::~TrainData() = default;

void TrainData::plan_epoch(const vlm::data::SamplerCursor& from) {
  loader_.reset();
  steps_.clear();
  items_.clear();
  next_step_ = 0;
  vlm::data::SamplerCursor c = from;
  do {
    PlannedStep ps;
    ps.start = c;
    std::vector<vlm::collate::SampleCost> step_costs;
    for (int64_t r = 0; r < data_world_; ++r) {
      vlm::data::SamplerStep s = sampler_->step(c, r);
      for (int64_t idx : s.indices) step_costs.push_back(costs_[static_cast<size_t>(idx)]);
      ps.padded += s.padded;
      ps.next = s.next;
    }
    vlm::collate::StepPlan plan = vlm::collate::plan_step(step_costs, static_cast<int>(data_world_), budgets_);
    ps.mine = std::move(plan.ranks[static_cast<size_t>(data_rank_)]);
    ps.plan_skipped = static_cast<int64_t>(plan.skipped.size());
    if (rank_ == 0)
      for (const auto& sk : plan.skipped)
        warn_(vlm::str(ds_.records[static_cast<size_t>(sk.index)].location(), ": skipped: ", sk.reason));
    steps_.push_back(std::move(ps));
    c = steps_.back().next;
  } while (c.epoch == from.epoch);
  for (const PlannedStep& ps : steps_)
    for (const auto& mb : ps.mine.micro_batches)
      for (const auto& s : mb.samples) items_.push_back(&s);
  std::vector<int64_t> order(items_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int64_t>(k);
  vlm::data::LoaderOptions lo;
  lo.workers = recipe_.data.num_workers;
  lo.prefetch = std::max<int64_t>(1, recipe_.data.prefetch * recipe_.batch.samples_per_rank);
  loader_ = std::make_unique<vlm::data::OrderedLoader<Produced>>(
      std::move(order), [this](int64_t item) { return produce(item); }, lo,
      [this](int64_t item) { return ds_.records[static_cast<size_t>(items_[static_cast<size_t>(item)]->index)].location(); });
}

TrainData::Produced TrainData::produce(int64_t item) const {
  const vlm::collate::PlannedSample& ps = *items_[static_cast<size_t>(item)];
  const vlm::data::Record& rec = ds_.records[static_cast<size_t>(ps.index)];
  std::vector<vlm::ImageSize> targets;
  for (const auto& im : ps.images) targets.push_back(im.resized);
  vlm::data::SampleOptions so = sample_opts_;
  if (ps.truncated) so.max_length = ps.seq_len;
  Produced out;
  try {
    out.sample = vlm::data::load_sample(tok_, rec, pixels_, so, ps.index, targets);
  } catch (const vlm::data::SampleSkip& e) {
    out.failure = vlm::str(rec.location(), ": skipped (", e.reason, "): ", e.what());
  } catch (const std::exception& e) {
    out.failure = vlm::str(rec.location(), ": skipped: ", e.what());
  }
  return out;
}

StepData TrainData::next(const vlm::data::SamplerCursor& cursor) {
  if (!loader_ || next_step_ >= steps_.size() || !(steps_[next_step_].start == cursor)) plan_epoch(cursor);
  const PlannedStep& ps = steps_[next_step_++];
  StepData out;
  out.next = ps.next;
  out.plan_skipped = ps.plan_skipped;
  out.padded = ps.padded;
  for (const auto& mb : ps.mine.micro_batches) {
    std::vector<vlm::TokenizedSample> samples;
    for (size_t k = 0; k < mb.samples.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      std::optional<Produced> p = loader_->next();
      out.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      VLM_CHECK(p.has_value(), "train data: the loader ran dry inside a planned step (internal error)");
      if (p->sample) {
        samples.push_back(std::move(*p->sample));
        ++built_;
        continue;
      }
      ++failed_;
      ++out.dropped;
      warn_(vlm::str("rank ", rank_, ": ", p->failure));
      const double limit = recipe_.data.max_bad_fraction * static_cast<double>(built_ + failed_);
      VLM_CHECK(static_cast<double>(failed_) <= std::max(limit, 1.0), "data: ", failed_, " of ",
                built_ + failed_, " training samples on rank ", rank_, " failed to build, more than "
                "data.max_bad_fraction = ", recipe_.data.max_bad_fraction, " (last: ", p->failure, ")");
    }
    if (samples.empty()) {
      out.micro_batches.push_back(vlm::collate::filler_micro_batch(pad_id_));
      continue;
    }
    out.samples += static_cast<int64_t>(samples.size());
    for (const auto& s : samples) out.images += static_cast<int64_t>(s.grid_thw.size());
    out.micro_batches.push_back(recipe_.batch.packing ? vlm::collate::build_packed_micro_batch(samples, cfg_)
                                                      : vlm::collate::build_micro_batch(samples, cfg_, pad_id_));
  }
  return out;
}

}  // namespace vlm::app
