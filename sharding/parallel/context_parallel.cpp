#include "sharding/parallel/context_parallel.h"

#include <algorithm>

#include "sharding/parallel/all_to_all_rows.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {
namespace {

class CommSequenceExchange : public vlm::SequenceExchange {
 public:
  explicit CommSequenceExchange(Comm& comm) : comm_(comm), ones_(static_cast<size_t>(comm.world_size()), 1) {}
  int64_t size() const override { return comm_.world_size(); }
  int64_t rank() const override { return comm_.rank(); }
  // x: [cp, ...] -> [cp, ...]: one row per rank of the flattened chunks.
  torch::Tensor all_to_all(const torch::Tensor& x, const std::string& what) override {
    VLM_ASSERT(x.size(0) == size(), "sequence exchange: ", x.sizes(), " has no chunk per rank (", size(), ")");
    auto rows = x.contiguous().view({size(), -1});
    return AllToAllRows::apply(rows, comm_address(comm_), ones_, ones_, what).view(x.sizes());
  }

 private:
  Comm& comm_;
  const std::vector<int64_t> ones_;
};

}  // namespace

std::shared_ptr<vlm::SequenceExchange> comm_sequence_exchange(Comm& comm) {
  return std::make_shared<CommSequenceExchange>(comm);
}

std::string context_parallel_problem(const vlm::TextConfig& cfg, int64_t cp) {
  if (cp <= 1) return "";
  if (cfg.count_layers(vlm::MixerKind::full_attention) > 0) {
    const std::string heads = vlm::ulysses_heads_problem(cfg.num_attention_heads, cfg.num_key_value_heads, cp);
    if (!heads.empty()) return "the decoder's " + heads;
  }
  if (cfg.count_layers(vlm::MixerKind::linear_attention) > 0) {  // value heads, key heads (Gated DeltaNet)
    const std::string heads =
        vlm::ulysses_heads_problem(cfg.linear_num_value_heads, cfg.linear_num_key_heads, cp, "value heads", "key heads");
    if (!heads.empty()) return "the decoder's Gated DeltaNet layers: " + heads;
  }
  return "";
}

void apply_context_parallel(vlm::VisionLanguageModelImpl& model, ParallelDims& dims) {
  if (dims.cp() == 1) return;
  const std::string problem = context_parallel_problem(model.cfg.text, dims.cp());
  VLM_CHECK(problem.empty(), "dist.cp = ", dims.cp(), ": ", problem,
            " (hint: Ulysses gives each rank of the group H / cp attention heads of the whole sequence; pick a cp "
            "that divides the heads, or 1)");
  model.set_sequence_exchange(comm_sequence_exchange(dims.cp_comm()));
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

}  // namespace vlm::sharding
