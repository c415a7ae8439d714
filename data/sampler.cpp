#include "data/sampler.h"

#include <algorithm>
#include <numeric>

#include "vlm/runtime/check.h"

namespace vlm::data {

namespace {
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  uint64_t s = seed ^ (0xD1B54A32D192ED03ull * (stream + 1));
  splitmix64(s);
  return splitmix64(s);
}

uint64_t uniform_below(uint64_t bound, uint64_t& state) {
  VLM_ASSERT(bound > 0);
  // Rejection sampling: unbiased.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do x = splitmix64(state); while (x >= limit);
  return x % bound;
}

void shuffle_indices(std::vector<int64_t>& v, uint64_t seed) {
  uint64_t state = seed;
  for (size_t i = v.size(); i > 1; --i) {
    size_t j = size_t(uniform_below(i, state));
    std::swap(v[i - 1], v[j]);
  }
}

DistributedSampler::DistributedSampler(SamplerOptions opts) : opts_(std::move(opts)) {
  VLM_CHECK(opts_.dataset_size > 0, "sampler: dataset is empty (hint: check data.train)");
  VLM_CHECK(opts_.world_size > 0, "sampler: world_size must be >= 1, got ", opts_.world_size);
  VLM_CHECK(opts_.batch_per_rank > 0, "sampler: batch_per_rank must be >= 1, got ",
            opts_.batch_per_rank);
  if (opts_.group_by_length) {
    VLM_CHECK(int64_t(opts_.costs.size()) == opts_.dataset_size, "sampler: length grouping ",
              "needs one cost per sample: expected ", opts_.dataset_size, ", got ",
              opts_.costs.size());
    VLM_CHECK(opts_.group_size > 0 && opts_.groups_per_chunk > 0,
              "sampler: group_size and groups_per_chunk must be >= 1");
  }
}

std::vector<int64_t> DistributedSampler::epoch_order(int64_t epoch) const {
  const int64_t n = opts_.dataset_size;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (!opts_.shuffle) return order;
  shuffle_indices(order, mix_seed(opts_.seed, 2 * uint64_t(epoch)));
  if (!opts_.group_by_length) return order;
  const int64_t g = opts_.group_size, chunk = g * opts_.groups_per_chunk;
  const auto& cost = opts_.costs;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    auto b = order.begin() + begin, e = order.begin() + std::min(n, begin + chunk);
    std::stable_sort(b, e, [&](int64_t x, int64_t y) { return cost[x] > cost[y]; });
  }
  // Shuffle whole groups (the last one may be short).
  const int64_t groups = (n + g - 1) / g;
  std::vector<int64_t> group_ids(groups);
  std::iota(group_ids.begin(), group_ids.end(), 0);
  shuffle_indices(group_ids, mix_seed(opts_.seed, 2 * uint64_t(epoch) + 1));
  std::vector<int64_t> out;
  out.reserve(n);
  for (int64_t gi : group_ids)
    for (int64_t k = gi * g; k < std::min(n, (gi + 1) * g); ++k) out.push_back(order[k]);
  return out;
}

int64_t DistributedSampler::steps_remaining(int64_t offset) const {
  const int64_t left = opts_.dataset_size - offset;
  VLM_CHECK(left > 0 || offset == 0, "sampler: offset ", offset, " outside the epoch of ",
            opts_.dataset_size, " samples");
  return (left + global_batch() - 1) / global_batch();
}

int64_t DistributedSampler::padding_from(int64_t offset) const {
  return steps_remaining(offset) * global_batch() - (opts_.dataset_size - offset);
}

SamplerStep DistributedSampler::step(const SamplerCursor& cursor, int64_t rank) const {
  const int64_t n = opts_.dataset_size;
  VLM_CHECK(rank >= 0 && rank < opts_.world_size, "sampler: rank ", rank, " outside world of ",
            opts_.world_size);
  VLM_CHECK(cursor.epoch >= 0 && cursor.offset >= 0 && cursor.offset < n, "sampler: cursor (",
            cursor.epoch, ", ", cursor.offset, ") outside an epoch of ", n,
            " samples (hint: the dataset changed since the checkpoint?)");
  const std::vector<int64_t> order = epoch_order(cursor.epoch);
  SamplerStep out;
  const int64_t start = cursor.offset + rank * opts_.batch_per_rank;
  for (int64_t k = 0; k < opts_.batch_per_rank; ++k) {
    const int64_t pos = start + k;
    if (pos < n) {
      out.indices.push_back(order[pos]);
    } else {
      out.indices.push_back(order[(pos - n) % n]);  // padding: repeat from the start
      ++out.padded;
    }
  }
  const int64_t next = cursor.offset + global_batch();
  out.next = next >= n ? SamplerCursor{cursor.epoch + 1, 0} : SamplerCursor{cursor.epoch, next};
  return out;
}

std::vector<int64_t> DistributedSampler::rank_epoch(const SamplerCursor& cursor,
                                                    int64_t rank) const {
  std::vector<int64_t> out;
  SamplerCursor c = cursor;
  while (c.epoch == cursor.epoch) {
    SamplerStep s = step(c, rank);
    out.insert(out.end(), s.indices.begin(), s.indices.end());
    c = s.next;
  }
  return out;
}

}  // namespace vlm::data
