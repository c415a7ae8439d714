#include "vlm/model/sequence_parallel.h"

#include "vlm/runtime/check.h"

namespace vlm {

SequenceChunk sequence_chunk(int64_t length, int64_t cp, int64_t rank) {
  VLM_ASSERT(cp >= 1 && rank >= 0 && rank < cp, "sequence_chunk: rank ", rank, " of ", cp);
  SequenceChunk c;
  c.padded = (length + cp - 1) / cp * cp;
  c.len = c.padded / cp;
  c.begin = rank * c.len;
  return c;
}

const char* sequence_mode_name(SequenceMode mode) { return mode == SequenceMode::kRing ? "ring" : "ulysses"; }

SequenceMode parse_sequence_mode(const std::string& name, const std::string& what) {
  if (name == "ulysses") return SequenceMode::kUlysses;
  VLM_CHECK(name == "ring", what, ": expected \"ulysses\" or \"ring\", got \"", name,
            "\" (hint: dist.cp_mode picks how a context-parallel group attends)");
  return SequenceMode::kRing;
}

std::vector<int64_t> SequenceLayout::positions() const {
  std::vector<int64_t> p;
  p.reserve(static_cast<size_t>(len));
  for (const TokenRun& r : runs)
    for (int64_t i = 0; i < r.len; ++i) p.push_back(r.begin + i);
  return p;
}

SequenceLayout sequence_layout(int64_t length, int64_t cp, int64_t rank, SequenceMode mode) {
  VLM_ASSERT(cp >= 1 && rank >= 0 && rank < cp, "sequence_layout: rank ", rank, " of ", cp);
  SequenceLayout s;
  if (mode == SequenceMode::kUlysses) {
    const SequenceChunk c = sequence_chunk(length, cp, rank);
    s.padded = c.padded;
    s.len = c.len;
    s.runs = {{c.begin, c.len}};
    return s;
  }
  const int64_t n = 2 * cp;  // chunks r and 2 cp - 1 - r: r < cp <= 2 cp - 1 - r, so in order
  s.padded = (length + n - 1) / n * n;
  const int64_t c = s.padded / n;
  s.len = 2 * c;
  s.runs = {{rank * c, c}, {(n - 1 - rank) * c, c}};
  return s;
}

torch::Tensor gather_layout(const torch::Tensor& x, int64_t dim, const SequenceLayout& layout) {
  VLM_ASSERT(x.size(dim) == layout.padded, "gather_layout: ", x.sizes(), " has no ", layout.padded,
             " tokens along dim ", dim);
  if (layout.runs.size() == 1) return x.narrow(dim, layout.runs[0].begin, layout.runs[0].len);
  std::vector<torch::Tensor> parts;
  for (const TokenRun& r : layout.runs) parts.push_back(x.narrow(dim, r.begin, r.len));
  return torch::cat(parts, dim);
}

torch::Tensor layout_local_index(const SequenceLayout& layout) {
  auto index = torch::full({layout.padded}, int64_t{-1}, torch::kInt64);
  auto* p = index.data_ptr<int64_t>();
  int64_t local = 0;
  for (const TokenRun& r : layout.runs)
    for (int64_t i = 0; i < r.len; ++i) p[r.begin + i] = local++;
  return index;
}

torch::Tensor rank_order_to_sequence(const torch::Tensor& x, int64_t dim, int64_t cp, SequenceMode mode) {
  if (mode == SequenceMode::kUlysses || cp == 1) return x;
  const int64_t l = x.size(dim);
  VLM_ASSERT(l % (2 * cp) == 0, "rank_order_to_sequence: ", l, " tokens do not divide by 2 cp = ", 2 * cp);
  auto v = x.unflatten(dim, {cp, 2, l / (2 * cp)});  // [.., rank, run, c, ..]
  // Chunks 0 .. cp-1: each rank's first run; chunks cp .. 2cp-1: the second runs, last rank first.
  return torch::cat({v.select(dim + 1, 0), v.select(dim + 1, 1).flip(dim)}, dim).flatten(dim, dim + 1);
}

torch::Tensor sequence_to_rank_order(const torch::Tensor& x, int64_t dim, int64_t cp, SequenceMode mode) {
  if (mode == SequenceMode::kUlysses || cp == 1) return x;
  const int64_t l = x.size(dim);
  VLM_ASSERT(l % (2 * cp) == 0, "sequence_to_rank_order: ", l, " tokens do not divide by 2 cp = ", 2 * cp);
  auto v = x.unflatten(dim, {2, cp, l / (2 * cp)});  // [.., half, chunk, c, ..]
  return torch::stack({v.select(dim, 0), v.select(dim, 1).flip(dim)}, dim + 1).flatten(dim, dim + 2);
}

std::string ulysses_heads_problem(int64_t heads, int64_t kv_heads, int64_t cp, const std::string& heads_name,
                                  const std::string& kv_name) {
  if (heads % cp != 0) return str(heads, " ", heads_name, " do not divide by cp = ", cp);
  if (kv_heads % cp != 0 && cp % kv_heads != 0)
    return str(kv_heads, " ", kv_name, " neither divide by cp = ", cp, " nor divide it");
  return "";
}

namespace {

// [B, h, Ls, D] -> [cp, B, Ls, h / cp, D]: chunk j holds heads [j * h / cp, (j + 1) * h / cp).
torch::Tensor head_chunks(const torch::Tensor& x, int64_t cp) {
  const int64_t b = x.size(0), h = x.size(1), ls = x.size(2), d = x.size(3);
  return x.reshape({b, cp, h / cp, ls, d}).permute({1, 0, 3, 2, 4});
}

}  // namespace

HeadShardedQkv seq_to_heads(SequenceExchange& ex, const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v, const std::string& what) {
  const int64_t cp = ex.size();
  const int64_t b = q.size(0), h = q.size(1), ls = q.size(2), d = q.size(3);
  const std::string problem = ulysses_heads_problem(h, k.size(1), cp);
  VLM_CHECK(problem.empty(), what, ": ", problem,
            " (hint: sequence parallelism gives each rank of the context-parallel group H / cp heads of every "
            "attention; pick a dist.cp that divides the heads)");
  torch::Tensor kk = k, vv = v;
  if (k.size(1) < cp) {  // GQA with fewer kv heads than ranks: each rank gets a copy of its kv head
    kk = k.repeat_interleave(cp / k.size(1), 1);
    vv = v.repeat_interleave(cp / v.size(1), 1);
  }
  const int64_t hc = h / cp, hk = kk.size(1) / cp;
  // [cp, B, Ls, hc + 2 hk, D]: chunk j (rank j's heads of this rank's tokens) goes to rank j.
  auto send = torch::cat({head_chunks(q, cp), head_chunks(kk, cp), head_chunks(vv, cp)}, 3).contiguous();
  auto got = ex.all_to_all(send, what);  // chunk j: rank j's tokens, this rank's heads
  // Each of q, k, v its own [B, L, h, D] tensor (one copy in all), seen as [B, h, L, D]: the
  // layout attention kernels take without copying again (and then keeping the copy). split:
  // its backward assembles the three gradients in one tensor (narrow's would make three).
  auto parts = got.split_with_sizes({hc, hk, hk}, 3);
  auto whole = [&](const torch::Tensor& p) {
    return p.permute({1, 0, 2, 3, 4}).reshape({b, cp * ls, p.size(3), d}).transpose(1, 2);
  };
  return {whole(parts[0]), whole(parts[1]), whole(parts[2])};
}

torch::Tensor heads_to_seq(SequenceExchange& ex, const torch::Tensor& o, const std::string& what) {
  const int64_t cp = ex.size();
  const int64_t b = o.size(0), hc = o.size(1), l = o.size(2), d = o.size(3), ls = l / cp;
  VLM_ASSERT(l % cp == 0, what, ": ", l, " tokens do not divide by cp ", cp);
  // [cp, B, Ls, hc, D]: chunk j (rank j's tokens of this rank's heads) goes to rank j.
  auto send = o.reshape({b, hc, cp, ls, d}).permute({2, 0, 3, 1, 4}).contiguous();
  auto got = ex.all_to_all(send, what);  // chunk j: this rank's tokens, rank j's heads
  return got.permute({1, 2, 0, 3, 4}).reshape({b, ls, cp * hc, d});
}

torch::Tensor SequenceExchange::all_gather(const torch::Tensor& x, const std::string& what) {
  const int64_t n = size();
  if (n == 1) return x;
  std::vector<int64_t> shape{n};
  for (int64_t s : x.sizes()) shape.push_back(s);
  auto got = all_to_all(x.unsqueeze(0).expand(shape), what);  // [n, ...]: rank j's x at j
  return got.flatten(0, 1);
}

torch::Tensor SequenceExchange::reduce_scatter(const torch::Tensor& x, const std::string& what) {
  const int64_t n = size();
  if (n == 1) return x;
  VLM_ASSERT(x.size(0) % n == 0, what, ": ", x.size(0), " rows do not divide by ", n);
  std::vector<int64_t> shape{n, x.size(0) / n};
  for (int64_t i = 1; i < x.dim(); ++i) shape.push_back(x.size(i));
  return all_to_all(x.reshape(shape), what).sum(0);  // rows chunk j went to rank j; summed
}

torch::Tensor SequenceExchange::all_reduce(const torch::Tensor& x, const std::string& what) {
  const int64_t n = size();
  if (n == 1) return x;
  std::vector<int64_t> shape{n};
  for (int64_t s : x.sizes()) shape.push_back(s);
  return all_to_all(x.unsqueeze(0).expand(shape), what).sum(0);
}

}  // namespace vlm
