// Distributed, deterministic, resumable sampler: a pure function of
// (dataset size, world size, per-rank batch, seed, epoch, cursor).
//
// Design: each epoch has ONE global order, a permutation of [0, N) that depends only on
// (seed, epoch) and, in length-grouped mode, on the per-sample costs; never on the world
// size. Training walks it in global steps of W x B samples: in step s rank r takes
// positions [s*W*B + r*B, s*W*B + (r+1)*B) of what is left of the epoch. When fewer than
// W*B real samples remain, the last step is padded by repeating the epoch's order from
// its start (reported as padding). So every rank gets exactly the same number of samples
// and steps, decided from global facts only.
//
// The cursor is (epoch, offset): offset = real samples of this epoch's order consumed
// so far (the global samples consumed in the epoch). Because the order does not depend
// on the world size, a run can resume on another world size: it continues at the same
// offset, and only the final padding of that epoch differs.
#pragma once
#include <cstdint>
#include <vector>

namespace vlm::data {

struct SamplerCursor {
  int64_t epoch = 0;
  int64_t offset = 0;   // real samples of the epoch's global order already consumed
  bool operator==(const SamplerCursor& o) const { return epoch == o.epoch && offset == o.offset; }
};

struct SamplerOptions {
  int64_t dataset_size = 0;
  int64_t world_size = 1;
  int64_t batch_per_rank = 1;     // samples each rank takes per step
  uint64_t seed = 0;
  bool shuffle = true;            // false: order 0..N-1 every epoch
  // Length-grouped mode: the shuffled order is cut into mega-chunks of
  // group_size x groups_per_chunk samples, each sorted by cost (descending), cut into
  // groups of group_size, and the groups' order is shuffled. Needs costs[N].
  bool group_by_length = false;
  int64_t group_size = 64;
  int64_t groups_per_chunk = 16;
  std::vector<int64_t> costs;     // per-sample token cost (length grouping only)
};

// One rank's share of one global step.
struct SamplerStep {
  std::vector<int64_t> indices;   // batch_per_rank dataset indices for this rank
  int64_t padded = 0;             // how many of them are padding repeats
  SamplerCursor next;             // cursor after this step (all ranks agree)
};

class DistributedSampler {
 public:
  explicit DistributedSampler(SamplerOptions opts);

  const SamplerOptions& options() const { return opts_; }
  int64_t global_batch() const { return opts_.world_size * opts_.batch_per_rank; }

  // The epoch's global order: a permutation of [0, N).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

  // Steps needed to finish the epoch from `offset`, and padding that adds.
  int64_t steps_remaining(int64_t offset) const;
  int64_t padding_from(int64_t offset) const;
  int64_t steps_per_epoch() const { return steps_remaining(0); }
  int64_t padding_per_epoch() const { return padding_from(0); }

  // Rank `rank`'s samples of the step that starts at `cursor`.
  SamplerStep step(const SamplerCursor& cursor, int64_t rank) const;

  // All indices rank `rank` gets in the rest of the epoch from `cursor` (concatenated steps).
  std::vector<int64_t> rank_epoch(const SamplerCursor& cursor, int64_t rank) const;

 private:
  SamplerOptions opts_;
};

// Deterministic RNG helpers (portable: no std:: distributions).
uint64_t mix_seed(uint64_t seed, uint64_t stream);        // splitmix64 of (seed, stream)
uint64_t uniform_below(uint64_t bound, uint64_t& state);  // in [0, bound), splitmix64 stream
void shuffle_indices(std::vector<int64_t>& v, uint64_t seed);  // Fisher-Yates

}  // namespace vlm::data
