// The step plan: which samples each rank processes in one optimizer step, at which image
// resolution, split into how many micro-batches. Computed identically on every rank from
// global facts only (the step's sample indices, their sizes, world size, budgets), so no
// rank can fall out of step: every rank runs the same number of micro-batches, and a rank
// short of work gets filler micro-batches (docs/design.md, invariants 1 and 2).
//
// Pure CPU code, no I/O and no collectives: collate decides, data executes (the loader
// resizes each image to the size chosen here).
//
// Cost model (used to balance ranks): a sample costs its sequence length (text + image
// tokens through the LLM) plus its merged image tokens again (the vision tower).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "vlm/model/image_geometry.h"

namespace vlm::collate {

// What the plan needs of one sample, known before any image is decoded (dataset index).
struct SampleCost {
  int64_t index = 0;                  // global dataset index
  int64_t text_tokens = 0;            // rendered conversation without the image pad tokens
  std::vector<ImageSize> images;      // oriented original sizes, in prompt order
};

struct Budgets {
  PixelLimits pixels;                 // smart_resize bounds per image
  int64_t factor = 28;                // resize factor = patch x merge of the model (Qwen3-VL: 32)
  int64_t max_image_tokens = 1024;    // per image, merged tokens (data.max_image_tokens)
  int64_t max_seq_len = 2048;         // per sample, text + image tokens (data.max_seq_len)
  int64_t max_tokens = 4096;          // per micro-batch: padded length x rows, or with packing
                                      // the sum of lengths (batch.max_tokens)
  int64_t batch_image_tokens = 4096;  // per micro-batch, merged image tokens (batch.max_image_tokens)
  int64_t max_micro_batches = 64;     // per rank and step; needing more is an error
  bool packing = false;               // padding-free packing: one row per micro-batch (batch.packing)
};

struct PlannedImage {
  ImageSize resized;                  // target size for the pixel pipeline (multiples of factor)
  int64_t tokens = 0;                 // merged tokens = (h/factor) * (w/factor)
  bool downscaled = false;            // below the per-image cap to fit a budget
};

struct PlannedSample {
  int64_t index = 0;
  int64_t seq_len = 0;                // tokens after image expansion and truncation
  int64_t image_tokens = 0;           // sum over images
  bool truncated = false;             // text cut to fit max_seq_len (images never are)
  std::vector<PlannedImage> images;
};

struct MicroBatchPlan {
  std::vector<PlannedSample> samples; // empty = filler (fully masked, dummy image)
  int64_t padded_len = 0;             // longest seq_len in the micro-batch
  int64_t tokens = 0;                 // sum of seq_len (the real tokens)
  int64_t image_tokens = 0;
  bool packed = false;                // one row of `tokens` tokens, no padding
  bool filler() const { return samples.empty(); }
  // Tokens the LLM runs on: rows x padded_len, or `tokens` when packed.
  int64_t padded_tokens() const {
    return packed ? tokens : padded_len * static_cast<int64_t>(samples.size());
  }
};

// Tokens in micro-batches and the padding among them (a filler counts one padding token:
// the one pad token it runs on).
struct PaddingCount {
  int64_t tokens = 0;
  int64_t padding = 0;
  double fraction() const { return tokens > 0 ? static_cast<double>(padding) / static_cast<double>(tokens) : 0.0; }
  PaddingCount& operator+=(const PaddingCount& o) {
    tokens += o.tokens;
    padding += o.padding;
    return *this;
  }
};

struct RankPlan {
  std::vector<MicroBatchPlan> micro_batches;  // same count on every rank
  int64_t cost = 0;                           // sum of sample costs (see header comment)
};

struct SkippedSample {
  int64_t index = 0;
  std::string reason;
};

struct StepPlan {
  std::vector<RankPlan> ranks;
  int64_t micro_batches = 0;          // per rank (including fillers)
  std::vector<SkippedSample> skipped; // samples that cannot fit even at min_pixels
  int64_t downscaled_images = 0;
  int64_t truncated_samples = 0;
};

// Padding of a planned micro-batch / of every rank's micro-batches of a step.
PaddingCount plan_padding(const MicroBatchPlan& mb);
PaddingCount plan_padding(const StepPlan& plan);

// Cost of a planned sample in the balancing model.
int64_t sample_cost(const PlannedSample& s);

// Fits one sample into the budgets: resizes its images under the per-image cap, then
// downscales them (never crops) until the sample fits max_seq_len, max_tokens and
// batch_image_tokens; truncates text only when the images at their minimum still leave
// too little room. Returns false with `reason` when nothing fits.
bool fit_sample(const SampleCost& sample, const Budgets& budgets, PlannedSample* out,
                std::string* reason);

// Plans one step: fits every sample, assigns samples to ranks by longest-processing-time
// first on cost (ties: lower index first, then lower rank), packs each rank's samples
// into micro-batches (first fit, longest first; a micro-batch holds rows x longest <=
// max_tokens, or with budgets.packing a sum of lengths <= max_tokens), and pads every rank
// with fillers to the same micro-batch count. Deterministic: identical inputs give
// identical plans everywhere.
StepPlan plan_step(const std::vector<SampleCost>& samples, int world_size, const Budgets& budgets);

}  // namespace vlm::collate
