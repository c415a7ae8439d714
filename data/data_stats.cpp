#include "data/data_stats.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "vlm/runtime/check.h"

namespace vlm::data {

int64_t pow2_bucket(int64_t v) {
  if (v <= 0) return 0;
  int64_t b = 1;
  while (b < v) b *= 2;
  return b;
}

void ValueStats::add(int64_t v) {
  min = count ? std::min(min, v) : v;
  max = count ? std::max(max, v) : v;
  ++count;
  sum += v;
  ++histogram[pow2_bucket(v)];
}

nlohmann::json ValueStats::to_json() const {
  nlohmann::json h = nlohmann::json::array();
  for (const auto& [upper, n] : histogram) h.push_back({upper, n});
  return {{"count", count}, {"sum", sum}, {"min", min}, {"max", max}, {"mean", mean()},
          {"histogram", h}};
}

nlohmann::json DatasetStats::to_json() const {
  nlohmann::json j = {{"lines", lines},
                      {"records", records},
                      {"bad", bad},
                      {"bad_by_reason", bad_by_reason},
                      {"images", images},
                      {"text_only_records", text_only_records},
                      {"image_width", image_width.to_json()},
                      {"image_height", image_height.to_json()},
                      {"image_tokens_uncapped", image_tokens_uncapped.to_json()},
                      {"image_tokens_capped", image_tokens_capped.to_json()},
                      {"images_over_cap", images_over_cap}};
  if (has_tokens) {
    j["text_tokens"] = text_tokens.to_json();
    j["supervised_tokens"] = supervised_tokens.to_json();
    j["seq_len"] = seq_len.to_json();
    j["over_max_seq_len"] = over_max_seq_len;
    j["no_supervised"] = no_supervised;
  }
  return j;
}

DatasetStats dataset_stats(const Dataset& ds, const std::vector<TextTokenCounts>& counts,
                           const StatsOptions& opts) {
  VLM_CHECK(counts.empty() || counts.size() == ds.records.size(), "dataset_stats: ",
            ds.records.size(), " records but ", counts.size(), " token counts");
  const vlm::PixelLimits capped = vlm::limits_with_token_cap(opts.limits, opts.max_image_tokens, opts.factor);
  DatasetStats s;
  s.lines = ds.lines;
  s.records = int64_t(ds.records.size());
  s.bad = int64_t(ds.bad.size());
  s.bad_by_reason = ds.bad_by_reason();
  s.has_tokens = !counts.empty();
  for (size_t i = 0; i < ds.records.size(); ++i) {
    const Record& r = ds.records[i];
    if (r.images.empty()) ++s.text_only_records;
    int64_t image_tokens = 0;
    for (const ImageRef& im : r.images) {
      ++s.images;
      s.image_width.add(im.width);
      s.image_height.add(im.height);
      const int64_t raw = vlm::image_tokens(im.height, im.width, opts.limits, opts.factor);
      const int64_t cap = vlm::image_tokens(im.height, im.width, capped, opts.factor);
      s.image_tokens_uncapped.add(raw);
      s.image_tokens_capped.add(cap);
      if (opts.max_image_tokens > 0 && raw > opts.max_image_tokens) ++s.images_over_cap;
      image_tokens += cap;
    }
    if (!s.has_tokens) continue;
    const TextTokenCounts& c = counts[i];
    s.text_tokens.add(c.text_tokens);
    s.supervised_tokens.add(c.supervised_tokens);
    const int64_t len = c.text_tokens + image_tokens;
    s.seq_len.add(len);
    if (opts.max_seq_len > 0 && len > opts.max_seq_len) ++s.over_max_seq_len;
    if (c.supervised_tokens == 0) ++s.no_supervised;
  }
  return s;
}

namespace {

void print_values(std::ostringstream& o, const std::string& name, const ValueStats& v) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-24s n=%lld min=%lld max=%lld mean=%.1f sum=%lld\n",
                name.c_str(), static_cast<long long>(v.count), static_cast<long long>(v.min),
                static_cast<long long>(v.max), v.mean(), static_cast<long long>(v.sum));
  o << buf;
  int64_t peak = 0;
  for (const auto& [b, n] : v.histogram) peak = std::max(peak, n);
  for (const auto& [b, n] : v.histogram) {
    const int bar = peak ? int((n * 40 + peak - 1) / peak) : 0;
    std::snprintf(buf, sizeof buf, "    <= %-8lld %8lld %s\n", static_cast<long long>(b),
                  static_cast<long long>(n), std::string(size_t(bar), '#').c_str());
    o << buf;
  }
}

}  // namespace

std::string format_stats(const std::string& title, const DatasetStats& s,
                         const StatsOptions& opts) {
  std::ostringstream o;
  o << title << ": " << s.records << " records from " << s.lines << " lines, " << s.bad
    << " bad\n";
  for (const auto& [reason, n] : s.bad_by_reason) o << "  bad: " << reason << ": " << n << "\n";
  o << "  images: " << s.images << " (" << s.text_only_records << " text-only records)\n";
  if (s.images > 0) {
    print_values(o, "image width (px)", s.image_width);
    print_values(o, "image height (px)", s.image_height);
    print_values(o, "image tokens (no cap)", s.image_tokens_uncapped);
    print_values(o, "image tokens (capped)", s.image_tokens_capped);
    o << "  images over the cap of " << opts.max_image_tokens << " tokens: " << s.images_over_cap
      << "\n";
  }
  if (s.has_tokens) {
    print_values(o, "text tokens", s.text_tokens);
    print_values(o, "supervised tokens", s.supervised_tokens);
    print_values(o, "sequence length", s.seq_len);
    o << "  over max_seq_len " << opts.max_seq_len << " (would be truncated): "
      << s.over_max_seq_len << "\n";
    o << "  records without supervised tokens: " << s.no_supervised << "\n";
  } else {
    o << "  (no tokenizer: text and sequence lengths not computed)\n";
  }
  return o.str();
}

}  // namespace vlm::data
