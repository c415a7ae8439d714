// Dataset statistics for `vlmtrain inspect data`: counts, bad records by reason, image size
// and image-token histograms (before/after the per-image token cap), text and sequence
// lengths, samples over max_seq_len, supervised-token totals. Needs no image decoding:
// sizes come from the dataset index, text token counts from data/token_counts.h.
//
// Histograms use power-of-two buckets: a value v > 0 falls in the bucket whose upper
// bound is the smallest power of two >= v (1, 2, 4, ..., so (2^(k-1), 2^k]); 0 has bucket 0.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/token_counts.h"
#include "vlm/model/image_geometry.h"

namespace vlm::data {

struct ValueStats {
  int64_t count = 0;
  int64_t sum = 0;
  int64_t min = 0;
  int64_t max = 0;
  std::map<int64_t, int64_t> histogram;  // bucket upper bound -> count
  void add(int64_t v);
  double mean() const { return count ? double(sum) / double(count) : 0.0; }
  nlohmann::json to_json() const;  // {count,sum,min,max,mean,histogram:[[upper,count],..]}
};

// Bucket upper bound of v (see above).
int64_t pow2_bucket(int64_t v);

struct DatasetStats {
  int64_t lines = 0;
  int64_t records = 0;
  std::map<std::string, int64_t> bad_by_reason;
  int64_t bad = 0;
  int64_t images = 0;
  int64_t text_only_records = 0;
  ValueStats image_width, image_height;     // oriented original sizes
  ValueStats image_tokens_uncapped;         // smart_resize under min/max pixels only
  ValueStats image_tokens_capped;           // ... and max_image_tokens
  int64_t images_over_cap = 0;              // uncapped > cap
  bool has_tokens = false;                  // text statistics below are filled
  ValueStats text_tokens;                   // per record, image pads excluded
  ValueStats supervised_tokens;             // per record
  ValueStats seq_len;                       // text + capped image tokens, per record
  int64_t over_max_seq_len = 0;             // seq_len > max_seq_len (would be truncated)
  int64_t no_supervised = 0;                // records with no supervised token
  nlohmann::json to_json() const;
};

struct StatsOptions {
  vlm::PixelLimits limits;        // data.min_pixels / data.max_pixels
  int64_t max_image_tokens = 0;   // data.max_image_tokens (0: no cap)
  int64_t factor = 28;            // the model's resize factor, patch x merge (Qwen3-VL: 32)
  int64_t max_seq_len = 0;        // data.max_seq_len (0: no limit)
};

// counts: one per record (dataset_text_token_counts), or empty for image-only statistics.
DatasetStats dataset_stats(const Dataset& ds, const std::vector<TextTokenCounts>& counts,
                           const StatsOptions& opts);

// Human-readable report (several lines, histograms as bars).
std::string format_stats(const std::string& title, const DatasetStats& s,
                         const StatsOptions& opts);

}  // namespace vlm::data
