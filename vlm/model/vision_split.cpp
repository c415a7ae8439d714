#include "vlm/model/vision_split.h"

#include <algorithm>

#include "vlm/model/attention.h"
#include "vlm/runtime/check.h"
#include "vlm/runtime/device_staging.h"

namespace vlm {

VisionSplit vision_split(SequenceExchange* sp, int64_t patches, int64_t unit, int64_t heads) {
  VisionSplit s;
  s.patches = s.padded = s.len = patches;
  if (sp == nullptr || !vision_splits(heads, sp->size())) return s;
  const int64_t cp = sp->size(), step = cp * unit;
  s.sp = sp;
  s.padded = (patches + step - 1) / step * step;
  s.len = s.padded / cp;
  s.begin = sp->rank() * s.len;
  return s;
}

torch::Tensor VisionSplit::rows(const torch::Tensor& x, const torch::Tensor& index) const {
  if (!active()) return index.defined() ? x.index_select(0, stage_to_device(index, x.device())) : x;
  VLM_ASSERT(x.size(0) == patches, "vision split: ", x.sizes(), " has no row per patch (", patches, ")");
  const int64_t real = std::clamp<int64_t>(patches - begin, 0, len);  // this rank's real rows
  auto shape = x.sizes().vec();
  shape[0] = len - real;
  // Padding only: still a slice of x (empty), so that the rank's graph reaches what made x and
  // its backward runs the same units (and their collectives) as the other ranks'.
  const int64_t from = real > 0 ? begin : 0;
  torch::Tensor mine;
  if (index.defined())
    mine = x.index_select(0, stage_to_device(index.narrow(0, from, real), x.device()));
  else
    mine = x.narrow(0, from, real);
  if (real == len) return index.defined() ? mine : mine.clone();  // not a view: the whole may be freed
  return torch::cat({mine, torch::zeros(shape, x.options())}, 0);
}

std::vector<int64_t> VisionSplit::segments(const std::vector<int64_t>& cu) const {
  std::vector<int64_t> out = cu;
  if (active() && padded > patches) out.push_back(padded);
  return out;
}

torch::Tensor VisionSplit::gather(const torch::Tensor& merged, const std::string& what) const {
  if (!active()) return merged;
  const int64_t cp = sp->size(), m = merged.size(0), unit = len / m;
  // Rank j's chunk is this rank's rows for every j; what comes back is every rank's rows.
  auto send = merged.unsqueeze(0).expand({cp, m, merged.size(1)}).contiguous();
  auto got = sp->all_to_all(send, what);  // [cp, Sr / U, O]
  return got.reshape({cp * m, merged.size(1)}).narrow(0, 0, patches / unit);
}

torch::Tensor vision_attention_split(SequenceExchange& sp, const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const std::vector<int64_t>& segments, double scale) {
  auto as_rows = [](const torch::Tensor& t) { return t.transpose(0, 1).unsqueeze(0); };  // [Sr, H, D] -> [1, H, Sr, D]
  auto hs = seq_to_heads(sp, as_rows(q), as_rows(k), as_rows(v), "vision sequence parallel q/k/v");
  auto packed = [](const torch::Tensor& t) { return t.squeeze(0).transpose(0, 1); };  // [1, h, Sp, D] -> [Sp, h, D]
  auto o = varlen_attention(packed(hs.q), packed(hs.k), packed(hs.v), segments, scale);  // [Sp, H / cp, D]
  return heads_to_seq(sp, o.transpose(0, 1).unsqueeze(0), "vision sequence parallel output").squeeze(0);
}

}  // namespace vlm
