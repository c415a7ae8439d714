// The group collectives of tensor parallelism as autograd Functions over a Comm (rows along
// dim 0; every rank of the group calls each in the same order, forward and backward):
//
//   AllGatherRows::apply(x, comm_address(comm), what)      x [n, ...] -> [N * n, ...] (rank order)
//       backward: the gradient reduce-scattered (summed over the ranks, this rank's rows)
//   ReduceScatterRows::apply(x, comm_address(comm), what)  x [N * n, ...] -> [n, ...]: rows
//       [r n, (r + 1) n) of the sum over the ranks; backward: the gradient all-gathered
//   AllReduceSum::apply(x, comm_address(comm), what)       x -> the sum over the ranks;
//       backward: the gradient's sum over the ranks
//
// Native NCCL all-gather / reduce-scatter / all-reduce on CUDA (Comm), so no rank builds the
// tp copies an all-to-all would need. The comm must outlive the graph (ParallelDims owns it).
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "sharding/dist/comm.h"
#include "sharding/parallel/all_to_all_rows.h"

namespace vlm::sharding {

namespace gather_rows_detail {
inline Comm& comm_at(int64_t addr) { return *reinterpret_cast<Comm*>(static_cast<intptr_t>(addr)); }
inline torch::Tensor gather(int64_t addr, const torch::Tensor& x, const std::string& what) {
  Comm& c = comm_at(addr);
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] *= c.world_size();
  torch::Tensor out = torch::empty(shape, x.options());
  c.all_gather(out.view({-1}), x.contiguous().view({-1}), what);
  return out;
}
inline torch::Tensor scatter(int64_t addr, const torch::Tensor& x, const std::string& what) {
  Comm& c = comm_at(addr);
  std::vector<int64_t> shape = x.sizes().vec();
  TORCH_CHECK(shape[0] % c.world_size() == 0, what, ": ", shape[0], " rows do not divide by ", c.world_size());
  shape[0] /= c.world_size();
  torch::Tensor out = torch::empty(shape, x.options());
  torch::Tensor in = x.contiguous();
  c.reduce_scatter(out.view({-1}), in.view({-1}), ReduceOp::kSum, what);
  return out;
}
inline torch::Tensor reduce(int64_t addr, const torch::Tensor& x, const std::string& what) {
  torch::Tensor out = x.contiguous().clone();
  comm_at(addr).all_reduce(out, ReduceOp::kSum, what);
  return out;
}
}  // namespace gather_rows_detail

struct AllGatherRows : public torch::autograd::Function<AllGatherRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t comm_addr,
                               const std::string& what) {
    ctx->saved_data["comm"] = comm_addr;
    ctx->saved_data["what"] = what;
    return gather_rows_detail::gather(comm_addr, x, what);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const std::string what = ctx->saved_data["what"].toStringRef() + " (backward)";
    return {gather_rows_detail::scatter(ctx->saved_data["comm"].toInt(), g[0], what), torch::Tensor(), torch::Tensor()};
  }
};

struct ReduceScatterRows : public torch::autograd::Function<ReduceScatterRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t comm_addr,
                               const std::string& what) {
    ctx->saved_data["comm"] = comm_addr;
    ctx->saved_data["what"] = what;
    return gather_rows_detail::scatter(comm_addr, x, what);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const std::string what = ctx->saved_data["what"].toStringRef() + " (backward)";
    return {gather_rows_detail::gather(ctx->saved_data["comm"].toInt(), g[0], what), torch::Tensor(), torch::Tensor()};
  }
};

struct AllReduceSum : public torch::autograd::Function<AllReduceSum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t comm_addr,
                               const std::string& what) {
    ctx->saved_data["comm"] = comm_addr;
    ctx->saved_data["what"] = what;
    return gather_rows_detail::reduce(comm_addr, x, what);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const std::string what = ctx->saved_data["what"].toStringRef() + " (backward)";
    return {gather_rows_detail::reduce(ctx->saved_data["comm"].toInt(), g[0], what), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace vlm::sharding
