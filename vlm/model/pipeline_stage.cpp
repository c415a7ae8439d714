#include "vlm/model/pipeline_stage.h"

#include <algorithm>
#include <limits>

#include "vlm/runtime/check.h"

namespace vlm {

bool PipelineStage::runs(const std::string& path) const {
  if (whole()) return true;
  if (path.rfind("visual.", 0) == 0 || path == "model.embed_tokens") return first();
  if (path == "model.norm" || path == "lm_head") return last();
  const std::string layers = "model.layers.";
  if (path.rfind(layers, 0) == 0) {
    const std::string rest = path.substr(layers.size());
    const int64_t i = std::stoll(rest.substr(0, rest.find('.')));
    return i >= first_layer && (end_layer < 0 || i < end_layer);
  }
  return false;
}

std::vector<PipelineStage> pipeline_stages(const std::vector<double>& cost, double first_extra, double last_extra,
                                           int64_t p, int64_t min_first) {
  const int64_t n = static_cast<int64_t>(cost.size());
  VLM_CHECK(p >= 1, "pipeline stages: expected at least 1, got ", p);
  VLM_CHECK(n >= p - 1 + std::max<int64_t>(1, min_first), "pipeline parallelism: ", n, " decoder layers cannot fill ",
            p, " stages of at least one layer each", min_first > 1 ? " with the first " : "",
            min_first > 1 ? std::to_string(min_first) + " (the DeepStack layers) on stage 0" : "",
            " (hint: a smaller dist.pp)");
  std::vector<double> prefix(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost[i];
  auto stage_cost = [&](int64_t s, int64_t a, int64_t b) {
    return prefix[b] - prefix[a] + (s == 0 ? first_extra : 0) + (s == p - 1 ? last_extra : 0);
  };
  // best[s][i]: the smallest largest-stage cost of layers [0, i) on stages 0..s; cut[s][i] its
  // last stage's first layer.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(p, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int64_t>> cut(p, std::vector<int64_t>(n + 1, 0));
  for (int64_t i = std::max<int64_t>(1, min_first); i <= n; ++i) best[0][i] = stage_cost(0, 0, i);
  for (int64_t s = 1; s < p; ++s)
    for (int64_t i = s + 1; i <= n; ++i)
      for (int64_t a = s; a < i; ++a) {
        const double v = std::max(best[s - 1][a], stage_cost(s, a, i));
        if (v < best[s][i]) best[s][i] = v, cut[s][i] = a;
      }
  std::vector<PipelineStage> out(p);
  int64_t end = n;
  for (int64_t s = p - 1; s >= 0; --s) {
    const int64_t begin = s == 0 ? 0 : cut[s][end];
    out[s] = {s, p, begin, end};
    end = begin;
  }
  return out;
}

double pipeline_bubble(int64_t p, int64_t m) {
  return p <= 1 ? 0.0 : static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
}

}  // namespace vlm
