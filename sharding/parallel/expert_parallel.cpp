// Expert parallelism: the dispatcher and apply_expert_parallel (see expert_parallel.h).
#include "sharding/parallel/expert_parallel.h"

#include <cstdint>

#include "sharding/parallel/all_to_all_rows.h"
#include "vlm/runtime/check.h"
#include "vlm/runtime/device_staging.h"

namespace vlm::sharding {
namespace {

// The permutation that regroups rows received as (source rank j, local expert h) blocks
// into (h, j) blocks, i.e. grouped by local expert. recv: [n, H] rows per block (host).
torch::Tensor regroup_order(const torch::Tensor& recv) {
  const int64_t n = recv.size(0), h_count = recv.size(1);
  const auto* c = recv.data_ptr<int64_t>();
  std::vector<int64_t> start(n * h_count);  // start of block (j, h) in the received order
  int64_t off = 0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t h = 0; h < h_count; ++h) {
      start[j * h_count + h] = off;
      off += c[j * h_count + h];
    }
  std::vector<int64_t> order;
  order.reserve(off);
  for (int64_t h = 0; h < h_count; ++h)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < c[j * h_count + h]; ++i) order.push_back(start[j * h_count + h] + i);
  return torch::tensor(order, torch::kInt64);
}

}  // namespace

ExpertParallelDispatcher::ExpertParallelDispatcher(Comm& comm, int64_t num_experts)
    : comm_(comm), num_experts_(num_experts), held_(num_experts / comm.world_size()) {
  VLM_CHECK(num_experts > 0 && num_experts % comm.world_size() == 0, "expert parallelism: ", num_experts,
            " experts do not split evenly over ep = ", comm.world_size(),
            " ranks (hint: dist.ep must divide the number of experts per layer)");
}

torch::Tensor ExpertParallelDispatcher::dispatch(vlm::MoeExpertsImpl& experts, const torch::Tensor& rows,
                                                 const torch::Tensor& counts) {
  const int64_t n = comm_.world_size(), q = comm_.rank(), h_count = held_;
  VLM_CHECK(experts.num_experts == num_experts_ && experts.held() == h_count && experts.first_expert == q * h_count,
            "expert parallelism: this layer holds experts [", experts.first_expert, ", ",
            experts.first_expert + experts.held(), ") of ", experts.num_experts, ", expected [", q * h_count, ", ",
            (q + 1) * h_count, ") of ", num_experts_, " (hint: apply_expert_parallel splits every sparse layer)");
  VLM_CHECK(counts.dim() == 1 && counts.size(0) == num_experts_, "expert dispatch: counts has ", counts.sizes(),
            ", expected [", num_experts_, "]");
  const std::string what = str(ctx_, ", expert dispatch ", stats_.dispatches);
  ++stats_.dispatches;
  // 1. Counts: [n, H] -> recv [n, H]; then one device-to-host read of both.
  const torch::Tensor send_counts = counts.to(torch::kInt64).contiguous();  // [E] = [n, H]
  torch::Tensor recv_counts = torch::empty_like(send_counts);
  const std::vector<int64_t> equal(n, h_count);
  comm_.all_to_all(recv_counts, send_counts, equal, equal, what + ", counts");
  const torch::Tensor host = torch::cat({send_counts, recv_counts}).to(torch::kCPU);  // [2E] (the one D2H read)
  const torch::Tensor host_send = host.narrow(0, 0, num_experts_).view({n, h_count});
  const torch::Tensor host_recv = host.narrow(0, num_experts_, num_experts_).view({n, h_count}).contiguous();
  std::vector<int64_t> send(n), recv(n);
  for (int64_t k = 0; k < n; ++k) {
    send[k] = host_send[k].sum().item<int64_t>();
    recv[k] = host_recv[k].sum().item<int64_t>();
    if (k != q) {
      stats_.rows_sent += send[k];
      stats_.rows_received += recv[k];
    }
  }
  VLM_CHECK(rows.dim() == 2 && rows.size(0) == host_send.sum().item<int64_t>(), "expert dispatch: rows ",
            rows.sizes(), " but the counts sum to ", host_send.sum().item<int64_t>());
  // 2. Rows to the ranks that hold their experts: [M, d] -> [R, d], (source, expert) order.
  //    In training the rows always take part in autograd, so that every rank's backward runs
  //    this all-to-all's reverse: on a rank whose rows need no gradient (everything before
  //    the layer frozen, no image in its micro-batch) autograd would skip it while the others
  //    wait in it. The gradient it brings back is dropped there.
  const int64_t addr = comm_address(comm_);
  const bool symmetric = torch::GradMode::is_enabled() && !rows.requires_grad();
  const torch::Tensor rows_in = symmetric ? rows.detach().requires_grad_(true) : rows;
  const torch::Tensor received = AllToAllRows::apply(rows_in, addr, send, recv, what + ", rows");
  // 3. Grouped by local expert, through the experts, back to the received order.
  const torch::Tensor order = vlm::stage_to_device(regroup_order(host_recv), rows.device());  // [R]
  const torch::Tensor inverse = torch::empty_like(order);
  inverse.index_put_({order}, torch::arange(order.size(0), order.options()));
  const torch::Tensor local_counts = host_recv.sum(0);                       // [H]
  const torch::Tensor grouped = received.index_select(0, order);             // [R, d]
  stats_.rows_computed += grouped.size(0);
  // No rows: compute() returns a [0, d] view of `grouped`, so the graph (and the reverse
  // all-to-alls in backward) stays connected.
  const torch::Tensor out = experts.compute(grouped, local_counts);          // [R, d]
  const torch::Tensor back = out.index_select(0, inverse);                   // [R, d]
  // 4. Results back in the caller's order: [R, d] -> [M, d].
  return AllToAllRows::apply(back, addr, recv, send, what + ", results");
}

std::vector<std::pair<std::string, vlm::MoeExpertsImpl*>> moe_experts(vlm::VisionLanguageModelImpl& model) {
  std::vector<std::pair<std::string, vlm::MoeExpertsImpl*>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (auto* e = item.value()->as<vlm::MoeExpertsImpl>()) out.emplace_back(item.key(), e);
  return out;
}

namespace {
// The held experts of every expert tensor of `experts` (full [E, ...] meta parameters), read
// from the source: name -> [H, ...].
std::vector<std::pair<std::string, torch::Tensor>> read_held(const std::string& path, vlm::MoeExpertsImpl& experts,
                                                             int64_t first, int64_t held, const ExpertLoad& load) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : experts.named_parameters(/*recurse=*/false)) {
    const torch::Tensor& p = item.value();
    VLM_CHECK(p.is_meta(), "expert parallelism: loading ", path, ".", item.key(), " from a source needs the model on "
              "the meta device, but it is on ", p.device());
    std::vector<int64_t> shape(p.sizes().begin(), p.sizes().end());
    const int64_t per = p.numel() / shape[0];
    shape[0] = held;
    torch::Tensor v = torch::empty(shape, torch::TensorOptions().device(load.device).dtype(load.dtype));
    const std::string name = path + "." + item.key();
    load.source->fill(name, first * per, (first + held) * per, v.view({-1}));
    if (load.stats != nullptr) load.stats->elements_filled += v.numel();
    out.emplace_back(item.key(), v);
  }
  return out;
}
}  // namespace

std::shared_ptr<ExpertParallelDispatcher> apply_expert_parallel(vlm::VisionLanguageModelImpl& model,
                                                                 const ParallelDims& dims, const ExpertLoad* load) {
  if (dims.ep() == 1) return nullptr;
  const auto experts = moe_experts(model);
  VLM_CHECK(!experts.empty(), "expert parallelism (dist.ep = ", dims.ep(),
            "): the model has no sparse MoE layer (hint: use an MoE model such as tiny-qwen3-moe, or dist.ep = 1)");
  const int64_t e = experts.front().second->num_experts, ep = dims.ep();
  VLM_CHECK(e % ep == 0, "expert parallelism: ", e, " experts per layer do not split over dist.ep = ", ep,
            " ranks (hint: pick an ep that divides ", e, ")");
  auto dispatcher = std::make_shared<ExpertParallelDispatcher>(dims.ep_comm(), e);
  const int64_t held = e / ep, first = dims.ep_rank() * held;
  const uint64_t read_before = load != nullptr ? load->source->bytes_read() : 0;
  for (const auto& [path, m] : experts) {
    VLM_CHECK(m->num_experts == e, "expert parallelism: ", path, " has ", m->num_experts, " experts, expected ", e,
              " like the first sparse layer");
    std::vector<std::pair<std::string, torch::Tensor>> values;
    if (load != nullptr) values = read_held(path, *m, first, held, *load);
    m->keep_experts(first, held);
    for (auto& [key, v] : values) m->replace_parameter(key, v);
    m->dispatcher = dispatcher;
    if (load != nullptr) {
      load->source->drop_resident_pages();
      if (load->stats != nullptr) ++load->stats->whole_units;
    }
  }
  if (load != nullptr && load->stats != nullptr) load->stats->bytes_read += load->source->bytes_read() - read_before;
  return dispatcher;
}

}  // namespace vlm::sharding
