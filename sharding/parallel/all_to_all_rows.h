// AllToAllRows: Comm::all_to_all as an autograd Function (rows along dim 0, variable
// splits), for the token dispatch of expert parallelism (expert_parallel.h) and the
// sequence exchange of context parallelism (context_parallel.h).
//
//   AllToAllRows::apply(x, comm_address(comm), send, recv, what)
//   x [sum(send), d] -> [sum(recv), d]: run k of x (send[k] rows) goes to rank k, run j of the
//   result came from rank j. Backward: the gradient goes back with the splits swapped, on the
//   same comm (every rank of the group runs the same backward, so the reverse ops match).
// The comm travels as its address in saved_data (an IValue holds no C++ reference); it must
// outlive the graph (the comms belong to ParallelDims).
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sharding/dist/comm.h"

namespace vlm::sharding {

inline int64_t comm_address(Comm& comm) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm)); }

struct AllToAllRows : public torch::autograd::Function<AllToAllRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t comm_addr,
                               const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                               const std::string& what) {
    ctx->saved_data["comm"] = comm_addr;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["what"] = what;
    return run(comm_addr, x, send, recv, what);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const int64_t comm_addr = ctx->saved_data["comm"].toInt();
    const auto send = ctx->saved_data["send"].toIntVector();
    const auto recv = ctx->saved_data["recv"].toIntVector();
    const std::string what = ctx->saved_data["what"].toStringRef() + " (backward)";
    // grad_out[0] is materialised (zeros) when undefined: every rank issues the op.
    torch::Tensor g = run(comm_addr, grad_out[0].contiguous(), recv, send, what);
    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
  // x: [sum(send), d] -> [sum(recv), d]
  static torch::Tensor run(int64_t comm_addr, const torch::Tensor& x, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv, const std::string& what) {
    Comm& comm = *reinterpret_cast<Comm*>(static_cast<intptr_t>(comm_addr));
    int64_t rows = 0;
    for (int64_t r : recv) rows += r;
    torch::Tensor out = torch::empty({rows, x.size(1)}, x.options());
    comm.all_to_all(out, x.contiguous(), recv, send, what);
    return out;
  }
};

}  // namespace vlm::sharding
