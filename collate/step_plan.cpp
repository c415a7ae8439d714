#include "collate/step_plan.h"

#include <algorithm>
#include <numeric>

#include "vlm/runtime/check.h"

namespace vlm::collate {
namespace {

// Room kept for text (template + prompt) when images have to shrink for a long sample.
constexpr int64_t kMinTextTokens = 16;

// Merged tokens of every image under a per-image cap of `cap` tokens (resize factor `factor`).
int64_t tokens_at_cap(const std::vector<ImageSize>& images, const PixelLimits& pixels, int64_t cap,
                      int64_t factor, std::vector<PlannedImage>* out) {
  PixelLimits limits = limits_with_token_cap(pixels, cap, factor);
  int64_t total = 0;
  if (out) out->clear();
  for (const auto& im : images) {
    ImageSize r = smart_resize(im.height, im.width, limits, factor);
    int64_t t = merged_tokens(r.height, r.width, factor);
    total += t;
    if (out) out->push_back({r, t, false});
  }
  return total;
}

}  // namespace

int64_t sample_cost(const PlannedSample& s) { return s.seq_len + s.image_tokens; }

PaddingCount plan_padding(const MicroBatchPlan& mb) {
  if (mb.filler()) return {1, 1};
  return {mb.padded_tokens(), mb.padded_tokens() - mb.tokens};
}

PaddingCount plan_padding(const StepPlan& plan) {
  PaddingCount c;
  for (const auto& rp : plan.ranks)
    for (const auto& mb : rp.micro_batches) c += plan_padding(mb);
  return c;
}

bool fit_sample(const SampleCost& sample, const Budgets& b, PlannedSample* out, std::string* reason) {
  out->index = sample.index;
  out->images.clear();
  out->truncated = false;
  VLM_CHECK(b.factor > 0, "plan: the resize factor (patch x merge) must be positive, got ", b.factor);
  const int64_t factor_sq = b.factor * b.factor;
  const int64_t min_cap = (b.pixels.min_pixels + factor_sq - 1) / factor_sq;
  const int64_t cap = std::min(b.max_image_tokens, b.pixels.max_pixels / factor_sq);
  const int64_t limit = std::min(b.max_seq_len, b.max_tokens);  // one row must fit a micro-batch

  int64_t image_tokens = 0;
  if (!sample.images.empty()) {
    try {
      image_tokens = tokens_at_cap(sample.images, b.pixels, cap, b.factor, &out->images);
    } catch (const vlm::Error& e) {  // zero-size or extreme aspect ratio
      *reason = e.what();
      return false;
    }
    const int64_t room = std::min(b.batch_image_tokens,
                                  limit - std::min(sample.text_tokens, kMinTextTokens));
    if (image_tokens > room) {
      // Largest uniform per-image cap whose images fit: tokens grow monotonically with it.
      int64_t lo = min_cap, hi = cap - 1, best = -1;
      while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (tokens_at_cap(sample.images, b.pixels, mid, b.factor, nullptr) <= room) best = mid, lo = mid + 1;
        else hi = mid - 1;
      }
      if (best < 0) {
        int64_t at_min = tokens_at_cap(sample.images, b.pixels, min_cap, b.factor, nullptr);
        *reason = str(sample.images.size(), " image(s) need at least ", at_min,
                      " merged tokens at min_pixels, but only ", room,
                      " fit (batch.max_image_tokens ", b.batch_image_tokens, ", sequence limit ",
                      limit, ", ", std::min(sample.text_tokens, kMinTextTokens),
                      " kept for text); hint: raise the budgets or lower data.min_pixels");
        return false;
      }
      image_tokens = tokens_at_cap(sample.images, b.pixels, best, b.factor, &out->images);
      for (auto& im : out->images) im.downscaled = true;
    }
  }
  out->image_tokens = image_tokens;
  out->seq_len = sample.text_tokens + image_tokens;
  if (out->seq_len > limit) {
    out->seq_len = limit;
    out->truncated = true;
  }
  if (out->seq_len <= 0) {
    *reason = "empty sample (no text and no image)";
    return false;
  }
  return true;
}

StepPlan plan_step(const std::vector<SampleCost>& samples, int world_size, const Budgets& b) {
  VLM_CHECK(world_size >= 1, "plan_step: world size must be >= 1, got ", world_size);
  StepPlan plan;
  plan.ranks.resize(world_size);

  // 1. Fit every sample into the budgets (resize / downscale / truncate / skip).
  std::vector<PlannedSample> fitted;
  fitted.reserve(samples.size());
  for (const auto& s : samples) {
    PlannedSample p;
    std::string reason;
    if (!fit_sample(s, b, &p, &reason)) {
      plan.skipped.push_back({s.index, reason});
      continue;
    }
    for (const auto& im : p.images) plan.downscaled_images += im.downscaled;
    plan.truncated_samples += p.truncated;
    fitted.push_back(std::move(p));
  }

  // 2. Longest-processing-time-first assignment to ranks.
  std::vector<size_t> order(fitted.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    int64_t cx = sample_cost(fitted[x]), cy = sample_cost(fitted[y]);
    return cx != cy ? cx > cy : fitted[x].index < fitted[y].index;
  });
  std::vector<std::vector<size_t>> per_rank(world_size);
  for (size_t i : order) {
    int best = 0;
    for (int r = 1; r < world_size; ++r)
      if (plan.ranks[r].cost < plan.ranks[best].cost) best = r;
    plan.ranks[best].cost += sample_cost(fitted[i]);
    per_rank[best].push_back(i);
  }

  // 3. Pack each rank's samples into micro-batches: first fit, longest first (the order of
  //    per_rank[r] is already decreasing cost; re-sort by length for padding).
  for (int r = 0; r < world_size; ++r) {
    auto& idx = per_rank[r];
    std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
      return fitted[x].seq_len != fitted[y].seq_len ? fitted[x].seq_len > fitted[y].seq_len
                                                    : fitted[x].index < fitted[y].index;
    });
    auto& mbs = plan.ranks[r].micro_batches;
    for (size_t i : idx) {
      const PlannedSample& s = fitted[i];
      MicroBatchPlan* target = nullptr;
      for (auto& mb : mbs) {
        int64_t len = std::max(mb.padded_len, s.seq_len);
        int64_t rows = static_cast<int64_t>(mb.samples.size()) + 1;
        const int64_t tokens = b.packing ? mb.tokens + s.seq_len : len * rows;
        if (tokens <= b.max_tokens && mb.image_tokens + s.image_tokens <= b.batch_image_tokens) {
          target = &mb;
          break;
        }
      }
      if (target == nullptr) target = &mbs.emplace_back();
      target->packed = b.packing;
      target->padded_len = std::max(target->padded_len, s.seq_len);
      target->tokens += s.seq_len;
      target->image_tokens += s.image_tokens;
      target->samples.push_back(s);
    }
    plan.micro_batches = std::max<int64_t>(plan.micro_batches, mbs.size());
  }

  // 4. Same micro-batch count on every rank (at least one, so every rank runs the units).
  plan.micro_batches = std::max<int64_t>(plan.micro_batches, 1);
  VLM_CHECK(plan.micro_batches <= b.max_micro_batches, "step needs ", plan.micro_batches,
            " micro-batches on one rank, more than batch.max_micro_batches = ", b.max_micro_batches,
            " (hint: raise batch.max_tokens / batch.max_image_tokens or lower batch.samples_per_rank)");
  for (auto& rp : plan.ranks) rp.micro_batches.resize(plan.micro_batches);
  return plan;
}

}  // namespace vlm::collate
