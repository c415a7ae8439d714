// StepStats <-> the one reduced float64 tensor (layout in step_stats.h).
#include "app/train/step_stats.h"

#include "vlm/runtime/check.h"

namespace vlm::app {

torch::Tensor StepStats::pack() const {
  return torch::tensor({loss_sum, static_cast<double>(samples), static_cast<double>(images),
                        static_cast<double>(llm_tokens), flops, static_cast<double>(dropped),
                        static_cast<double>(stop_requests), static_cast<double>(padding_tokens),
                        static_cast<double>(padding)},
                       torch::kFloat64);
}

StepStats StepStats::unpack(const torch::Tensor& t) {
  VLM_CHECK(t.defined() && t.dim() == 1 && t.size(0) == kFields, "step statistics: expected a [", kFields,
            "] tensor, got ", t.defined() ? vlm::str(t.sizes()) : std::string("an undefined one"),
            " (hint: pack it with StepStats::pack)");
  const torch::Tensor c = t.to(torch::kCPU, torch::kFloat64).contiguous();
  auto s = c.accessor<double, 1>();
  StepStats r;
  r.loss_sum = s[0];
  r.samples = static_cast<int64_t>(s[1]);
  r.images = static_cast<int64_t>(s[2]);
  r.llm_tokens = static_cast<int64_t>(s[3]);
  r.flops = s[4];
  r.dropped = static_cast<int64_t>(s[5]);
  r.stop_requests = static_cast<int64_t>(s[6]);
  r.padding_tokens = static_cast<int64_t>(s[7]);
  r.padding = static_cast<int64_t>(s[8]);
  return r;
}

StepStats reduce_step_stats(vlm::sharding::Comm& comm, const StepStats& local, const std::string& ctx) {
  torch::Tensor t = local.pack();
  comm.all_reduce(t, vlm::sharding::ReduceOp::kSum, ctx + ", step statistics");
  return StepStats::unpack(t);
}

}  // namespace vlm::app
