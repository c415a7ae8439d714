// Comm::all_to_all_async (contract and byte counting: sharding/dist/comm.h). Kept apart from
// comm.cpp, which holds the ring ops, because its checks are about split sizes.
//
// Issue: NCCL natively on the row tensors; Gloo (and Gloo with the shared-memory channel
// attached, which has no all-to-all) through the group's alltoall_base on the raw bytes:
// in and out seen as [rows x row bytes] uint8, splits scaled by the row bytes, so every dtype
// travels bit-exact. CUDA tensors on Gloo are staged through host copies.
#include <numeric>
#include <sstream>

#include "sharding/dist/comm.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {
namespace {

using WorkList = std::vector<c10::intrusive_ptr<c10d::Work>>;

std::string describe_rows(const torch::Tensor& t, const std::vector<int64_t>& splits) {
  std::ostringstream ss;
  ss << t.sizes() << " " << t.scalar_type() << " splits [";
  for (size_t k = 0; k < splits.size(); ++k) ss << (k ? "," : "") << splits[k];
  ss << "]";
  return ss.str();
}

void check_splits(const torch::Tensor& t, const std::vector<int64_t>& splits, int world, const char* name) {
  VLM_CHECK(t.defined() && t.dim() >= 1, "comm: all_to_all: ", name, " must be a defined tensor with rows (dim >= 1)");
  VLM_CHECK(t.is_contiguous(), "comm: all_to_all: ", name, " must be contiguous, got strides ", t.strides(),
            " (hint: pass a contiguous buffer)");
  VLM_CHECK(t.scalar_type() != torch::kBool, "comm: all_to_all: bool tensors are not supported (hint: convert to uint8)");
  VLM_CHECK(static_cast<int>(splits.size()) == world, "comm: all_to_all: ", name, " splits has ", splits.size(),
            " entries, expected one per rank (", world, ")");
  int64_t sum = 0;
  for (int64_t s : splits) {
    VLM_CHECK(s >= 0, "comm: all_to_all: ", name, " splits must be >= 0, got ", s);
    sum += s;
  }
  VLM_CHECK(sum == t.size(0), "comm: all_to_all: ", name, " splits sum to ", sum, " rows, but ", name, " has ",
            t.size(0), " (hint: size the buffer from the exchanged counts)");
}

// [rows, *] -> [rows * row bytes] uint8 (a view).
torch::Tensor row_bytes_view(const torch::Tensor& t) { return t.view(-1).view(torch::kByte); }

}  // namespace

Work Comm::all_to_all_async(const torch::Tensor& out, const torch::Tensor& in, const std::vector<int64_t>& out_splits,
                            const std::vector<int64_t>& in_splits, const std::string& ctx) {
  check_splits(in, in_splits, world_, "in");
  check_splits(out, out_splits, world_, "out");
  VLM_CHECK(out.scalar_type() == in.scalar_type() && out.device() == in.device() &&
                out.sizes().slice(1) == in.sizes().slice(1),
            "comm: all_to_all: out and in must share dtype, device and row shape, got out ", out.sizes(), " ",
            out.scalar_type(), " on ", out.device(), ", in ", in.sizes(), " ", in.scalar_type(), " on ", in.device());
  if (stage_on_host(out)) {
    torch::Tensor ho = torch::empty(out.sizes(), out.options().device(torch::kCPU)), hi = in.to(torch::kCPU);
    return staged(all_to_all_async(ho, hi, out_splits, in_splits, ctx + " (staged on the host)"),
                  [out, ho]() { out.copy_(ho); });
  }
  const int64_t row_elems = in.size(0) > 0 ? in.numel() / in.size(0) : out.size(0) > 0 ? out.numel() / out.size(0) : 0;
  const int64_t row_bytes = row_elems * static_cast<int64_t>(in.element_size());
  double sent = 0;
  for (int k = 0; k < world_; ++k)
    if (k != rank_) sent += static_cast<double>(in_splits[k]) * static_cast<double>(row_bytes);
  count(OpKind::kAllToAll, sent, sent);
  const bool native = backend_ == Backend::kNccl;
  const uint64_t seq = enter(OpKind::kAllToAll,
                             str(describe_rows(in, in_splits), " -> ", describe_rows(out, out_splits),
                                 native ? "" : shm_ ? " via gloo (tcp; the shared-memory channel has none)" : ""),
                             ctx);
  if (world_ == 1) {
    if (in.numel() > 0 && out.data_ptr() != in.data_ptr()) out.copy_(in);
    return launch(seq, nullptr, nullptr);
  }
  if (native) {
    auto issue = [this, o = out, i = in, out_splits, in_splits]() mutable {
      c10d::AllToAllOptions opt;
      opt.timeout = timeout_;
      std::vector<int64_t> os = out_splits, is = in_splits;
      return WorkList{group_->alltoall_base(o, i, os, is, opt)};
    };
    return launch(seq, issue, nullptr);
  }
  // Gloo: bytes. A rank with no rows still enters the op (Gloo sends and expects zero bytes).
  std::vector<int64_t> os(world_), is(world_);
  for (int k = 0; k < world_; ++k) {
    os[k] = out_splits[k] * row_bytes;
    is[k] = in_splits[k] * row_bytes;
  }
  // No rows: an empty byte tensor (c10d checks that the splits sum to its size, 0).
  torch::Tensor o = out.numel() > 0 ? row_bytes_view(out) : torch::empty({0}, torch::kByte);
  torch::Tensor i = in.numel() > 0 ? row_bytes_view(in) : torch::empty({0}, torch::kByte);
  auto issue = [this, o, i, os, is]() mutable {
    c10d::AllToAllOptions opt;
    opt.timeout = timeout_;
    return WorkList{group_->alltoall_base(o, i, os, is, opt)};
  };
  return launch(seq, issue, nullptr);
}

}  // namespace vlm::sharding
