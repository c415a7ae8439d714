#include "sharding/parallel/context_parallel.h"

#include <algorithm>

#include "sharding/parallel/all_to_all_rows.h"
#include "sharding/parallel/gather_rows.h"
#include "vlm/model/vision_split.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {
namespace {

class CommSequenceExchange : public vlm::SequenceExchange {
 public:
  CommSequenceExchange(Comm& comm, vlm::SequenceMode mode)
      : comm_(comm), mode_(mode), ones_(static_cast<size_t>(comm.world_size()), 1) {
    const int64_t n = comm.world_size(), r = comm.rank();
    to_next_.assign(static_cast<size_t>(n), 0);
    from_prev_.assign(static_cast<size_t>(n), 0);
    to_next_[static_cast<size_t>((r + 1) % n)] = 1;
    from_prev_[static_cast<size_t>((r - 1 + n) % n)] = 1;
  }
  int64_t size() const override { return comm_.world_size(); }
  int64_t rank() const override { return comm_.rank(); }
  vlm::SequenceMode mode() const override { return mode_; }
  // x: [cp, ...] -> [cp, ...]: one row per rank of the flattened chunks.
  torch::Tensor all_to_all(const torch::Tensor& x, const std::string& what) override {
    VLM_ASSERT(x.size(0) == size(), "sequence exchange: ", x.sizes(), " has no chunk per rank (", size(), ")");
    auto rows = x.contiguous().view({size(), -1});
    return AllToAllRows::apply(rows, comm_address(comm_), ones_, ones_, what).view(x.sizes());
  }
  // x flattened to one row: sent to the next rank, the previous rank's received (the other
  // splits 0, so every rank of the group takes part in each op; backward: swapped splits).
  torch::Tensor ring_pass(const torch::Tensor& x, const std::string& what) override {
    auto row = x.contiguous().view({1, -1});
    return AllToAllRows::apply(row, comm_address(comm_), to_next_, from_prev_, what).view(x.sizes());
  }
  // Tensor parallelism's collectives, native (gather_rows.h).
  torch::Tensor all_gather(const torch::Tensor& x, const std::string& what) override {
    return size() == 1 ? x : AllGatherRows::apply(x, comm_address(comm_), what);
  }
  torch::Tensor reduce_scatter(const torch::Tensor& x, const std::string& what) override {
    return size() == 1 ? x : ReduceScatterRows::apply(x, comm_address(comm_), what);
  }
  torch::Tensor all_reduce(const torch::Tensor& x, const std::string& what) override {
    return size() == 1 ? x : AllReduceSum::apply(x, comm_address(comm_), what);
  }

 private:
  Comm& comm_;
  const vlm::SequenceMode mode_;
  const std::vector<int64_t> ones_;
  std::vector<int64_t> to_next_, from_prev_;  // ring splits: one row to rank + 1, one from rank - 1
};

}  // namespace

std::shared_ptr<vlm::SequenceExchange> comm_sequence_exchange(Comm& comm, vlm::SequenceMode mode) {
  return std::make_shared<CommSequenceExchange>(comm, mode);
}

std::string context_parallel_problem(const vlm::TextConfig& cfg, int64_t cp, vlm::SequenceMode mode) {
  if (cp <= 1) return "";
  if (mode == vlm::SequenceMode::kUlysses && cfg.count_layers(vlm::MixerKind::full_attention) > 0) {
    const std::string heads = vlm::ulysses_heads_problem(cfg.num_attention_heads, cfg.num_key_value_heads, cp);
    if (!heads.empty()) return "the decoder's " + heads;
  }  // ring attention: any head counts
  if (cfg.count_layers(vlm::MixerKind::linear_attention) > 0) {  // value heads, key heads (Gated DeltaNet, either mode)
    const std::string heads =
        vlm::ulysses_heads_problem(cfg.linear_num_value_heads, cfg.linear_num_key_heads, cp, "value heads", "key heads");
    if (!heads.empty()) return "the decoder's Gated DeltaNet layers: " + heads;
  }
  return "";
}

void apply_context_parallel(vlm::VisionLanguageModelImpl& model, ParallelDims& dims, vlm::SequenceMode mode) {
  if (dims.cp() == 1) return;
  const std::string problem = context_parallel_problem(model.cfg.text, dims.cp(), mode);
  VLM_CHECK(problem.empty(), "dist.cp = ", dims.cp(), " (cp_mode ", vlm::sequence_mode_name(mode), "): ", problem,
            " (hint: Ulysses gives each rank of the group H / cp attention heads of the whole sequence; pick a cp "
            "that divides the heads, cp_mode = \"ring\" (no head requirement), or cp 1)");
  model.set_sequence_exchange(comm_sequence_exchange(dims.cp_comm(), mode));
}

double ulysses_layer_bytes(const vlm::TextConfig& cfg, vlm::MixerKind kind, int64_t cp, int64_t batch,
                           int64_t padded, int64_t bytes_per_element) {
  double per_token = 0;  // elements sent and received back per token, forward
  if (kind == vlm::MixerKind::full_attention) {
    const double h = static_cast<double>(cfg.num_attention_heads);
    const double hk = static_cast<double>(std::max<int64_t>(cfg.num_key_value_heads, cp));
    per_token = static_cast<double>(cfg.head_dim()) * (2 * h + 2 * hk);
  } else {
    const double hk = static_cast<double>(std::max<int64_t>(cfg.linear_num_key_heads, cp));
    const double hv = static_cast<double>(cfg.linear_num_value_heads);
    per_token = 2 * hk * static_cast<double>(cfg.linear_key_head_dim) +
                2 * hv * static_cast<double>(cfg.linear_value_head_dim) + 2 * hv;
  }
  const double tokens = static_cast<double>(batch) * static_cast<double>(padded / cp);
  return 2.0 * static_cast<double>(cp - 1) / static_cast<double>(cp) * tokens * per_token *
         static_cast<double>(bytes_per_element);
}

double ring_layer_bytes(const vlm::TextConfig& cfg, int64_t cp, int64_t batch, int64_t padded,
                        int64_t bytes_per_element, bool recomputed) {
  if (cp <= 1) return 0.0;
  // k and v of one rank's tokens, in elements.
  const double kv = static_cast<double>(batch) * static_cast<double>(cfg.num_key_value_heads) *
                    static_cast<double>(padded / cp) * static_cast<double>(cfg.head_dim()) * 2.0;
  const double hop = kv * static_cast<double>(bytes_per_element);
  const double forward = static_cast<double>(cp - 1) * hop;
  const double backward = static_cast<double>(cp - 1) * hop + static_cast<double>(cp) * kv * 4.0;  // dk/dv in fp32
  return forward * (recomputed ? 2.0 : 1.0) + backward;
}

double vision_split_bytes(const vlm::VisionConfig& v, int64_t cp, int64_t patches, int64_t bytes_per_element,
                          bool recomputed) {
  if (!vlm::vision_splits(v.num_heads, cp)) return 0.0;
  const int64_t unit = v.merge_unit(), step = cp * unit;
  const double rows = static_cast<double>((patches + step - 1) / step * step / cp);  // Sp / cp
  const double b = static_cast<double>(bytes_per_element), c = static_cast<double>(cp);
  const double block = (c - 1) / c * rows * static_cast<double>(v.head_dim() * 4 * v.num_heads) * b;  // forward
  const double merger = (c - 1) * rows / static_cast<double>(unit) * static_cast<double>(v.out_hidden_size) * b;
  const double mergers = 1.0 + static_cast<double>(v.deepstack_visual_indexes.size());
  return static_cast<double>(v.depth) * block * (recomputed ? 3.0 : 2.0) + mergers * merger * 2.0;
}

}  // namespace vlm::sharding
