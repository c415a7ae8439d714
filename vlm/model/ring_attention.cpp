#include "vlm/model/ring_attention.h"

#include <limits>

#include "vlm/runtime/check.h"
#include "vlm/runtime/device_staging.h"

namespace vlm {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The running result of one query run: out fp32 [B, H, n, D], lse fp32 [B, H, n].
struct RunState {
  torch::Tensor out, lse;
};

// One block's result: o fp32 [B, H, n, D] (0 on rows that see no key), lse fp32 [B, H, n]
// (-inf there).
struct BlockResult {
  torch::Tensor o, lse;
};

// What every block of one call shares: the whole sequence's key padding and segment ids.
struct RingMasks {
  torch::Tensor key_mask;  // bool [B, L] on the device, or undefined (every key real)
  torch::Tensor segment;   // int64 [L] on the device (segment of each position), or undefined
};

// Segment id of each padded position from the packed row's boundaries: [L] int64 (host).
torch::Tensor segment_ids(const std::vector<int64_t>& cu, int64_t padded) {
  VLM_CHECK(cu.size() >= 2 && cu.front() == 0 && cu.back() == padded, "ring attention: cu_seqlens must run from 0 to ",
            padded, " (the padded length), got ", cu.size(), " entries ending at ", cu.empty() ? -1 : cu.back(),
            " (hint: the packed row's boundaries over the whole sequence, padding included)");
  auto seg = torch::empty({padded}, torch::kInt64);
  auto* p = seg.data_ptr<int64_t>();
  for (size_t i = 0; i + 1 < cu.size(); ++i)
    for (int64_t t = cu[i]; t < cu[i + 1]; ++t) p[t] = static_cast<int64_t>(i);
  return seg;
}

// Which keys of run kr the queries of run qr may attend: bool broadcastable to [B, 1, 1, n, m]
// (the block's [B, Hkv, G, n, m] scores), or undefined when every pair is allowed.
torch::Tensor pair_mask(const RingMasks& rm, const TokenRun& qr, const TokenRun& kr, const torch::Device& dev) {
  const auto iopts = torch::TensorOptions().dtype(torch::kInt64).device(dev);
  auto qp = torch::arange(qr.begin, qr.begin + qr.len, iopts);  // [n] global positions
  auto kp = torch::arange(kr.begin, kr.begin + kr.len, iopts);  // [m]
  torch::Tensor allowed;                                        // [n, m] or [B, n, m]
  auto with = [&](const torch::Tensor& m) { allowed = allowed.defined() ? allowed.logical_and(m) : m; };
  if (kr.begin + kr.len - 1 > qr.begin) with(kp.unsqueeze(0) <= qp.unsqueeze(1));  // some key after some query
  if (rm.segment.defined())
    with(rm.segment.index_select(0, qp).unsqueeze(1) == rm.segment.index_select(0, kp).unsqueeze(0));
  if (rm.key_mask.defined()) {
    with(rm.key_mask.index_select(1, kp).unsqueeze(1));  // [B, 1, m]
    if (qr.begin < kr.begin + kr.len && kr.begin < qr.begin + qr.len)  // a query always sees itself
      allowed = allowed.logical_or(kp.unsqueeze(0) == qp.unsqueeze(1));
  }
  if (!allowed.defined()) return allowed;
  if (allowed.dim() == 2) allowed = allowed.unsqueeze(0);
  return allowed.unsqueeze(1).unsqueeze(1);  // [B or 1, 1, 1, n, m]
}

// One block in fp32 with explicit scores. q: [B, H, n, D], k / v: [B, Hkv, m, D] (any float
// dtype), mask as pair_mask's -> BlockResult.
BlockResult attend_block(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& mask, double scale) {
  const int64_t b = q.size(0), h = q.size(1), n = q.size(2), d = q.size(3), hkv = k.size(1);
  auto qg = q.to(torch::kFloat32).reshape({b, hkv, h / hkv, n, d});  // query head j -> kv head j / (H / Hkv)
  auto kf = k.to(torch::kFloat32).unsqueeze(2), vf = v.to(torch::kFloat32).unsqueeze(2);  // [B, Hkv, 1, m, D]
  auto scores = torch::matmul(qg, kf.transpose(-1, -2)) * scale;  // [B, Hkv, G, n, m]
  if (mask.defined()) scores = scores.masked_fill(mask.logical_not(), kNegInf);
  // Row maximum as a constant (the result does not depend on it); -inf rows (no key) -> 0.
  auto mx = scores.amax(-1, /*keepdim=*/true).detach();
  mx = torch::where(torch::isinf(mx), torch::zeros_like(mx), mx);
  auto e = torch::exp(scores - mx);  // masked: exp(-inf) = 0
  auto sum = e.sum(-1, /*keepdim=*/true);
  auto seen = sum > 0;
  auto safe = torch::where(seen, sum, torch::ones_like(sum));
  auto o = torch::matmul(e / safe, vf);  // [B, Hkv, G, n, D]
  auto lse = torch::where(seen, mx + torch::log(safe), torch::full({}, kNegInf, sum.options()));
  return {o.reshape({b, h, n, d}), lse.reshape({b, h, n})};
}

// Merges block result r into st (flash-style); st starts as the first block (finite lse on
// every row: the diagonal block, where each query sees itself).
void merge(RunState& st, const BlockResult& r) {
  if (!st.out.defined()) {
    st.out = r.o;
    st.lse = r.lse;
    return;
  }
  auto lse = torch::logaddexp(st.lse, r.lse);
  st.out = st.out * torch::exp(st.lse - lse).unsqueeze(-1) + r.o * torch::exp(r.lse - lse).unsqueeze(-1);
  st.lse = lse;
}

// Whether every key of kr lies after every query of qr (a causally empty pair, host-known).
bool pair_empty(const TokenRun& qr, const TokenRun& kr) { return kr.begin > qr.begin + qr.len - 1; }

// The local offset of each run of `layout` (its first token's index among the held ones).
std::vector<int64_t> run_offsets(const SequenceLayout& layout) {
  std::vector<int64_t> at;
  int64_t next = 0;
  for (const TokenRun& r : layout.runs) at.push_back(next), next += r.len;
  return at;
}

// The held run kr of the block kv: [B, 2 Hkv, Lr, D] -> k, v [B, Hkv, m, D], at local offset `at`.
std::pair<torch::Tensor, torch::Tensor> block_run(const torch::Tensor& kv, int64_t at, int64_t len) {
  const int64_t hkv = kv.size(1) / 2;
  auto run = kv.narrow(2, at, len);
  return {run.narrow(1, 0, hkv), run.narrow(1, hkv, hkv)};
}

}  // namespace

torch::Tensor ring_attention(SequenceExchange& ex, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& key_mask,
                             const std::vector<int64_t>* cu_seqlens, double scale, const std::string& what) {
  const int64_t cp = ex.size(), rank = ex.rank();
  const int64_t b = q.size(0), h = q.size(1), lr = q.size(2), hkv = k.size(1), l = lr * cp;
  VLM_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && k.size(0) == b && k.size(2) == lr && k.size(3) == q.size(3) &&
                h % hkv == 0,
            what, ": expected q [B, H, Lr, D] and k / v [B, Hkv, Lr, D] with H a multiple of Hkv, got q ", q.sizes(),
            ", k ", k.sizes(), ", v ", v.sizes());
  const SequenceLayout mine = sequence_layout(l, cp, rank, ex.mode());
  VLM_CHECK(mine.padded == l && mine.len == lr, what, ": ", lr, " tokens per rank do not fit the ",
            sequence_mode_name(ex.mode()), " layout of cp = ", cp,
            " (hint: the model pads the sequence to its layout's multiple before splitting it)");
  VLM_CHECK(!key_mask.defined() || (key_mask.dim() == 2 && key_mask.size(0) == b && key_mask.size(1) == l), what,
            ": key_mask: expected [", b, ", ", l, "] (the whole padded sequence), got ",
            key_mask.defined() ? key_mask.sizes() : torch::IntArrayRef{});
  VLM_CHECK(cu_seqlens == nullptr || b == 1, what, ": a packed row (cu_seqlens) has B = 1, got ", b);
  RingMasks rm;
  if (key_mask.defined()) rm.key_mask = key_mask.to(torch::kBool);
  if (cu_seqlens != nullptr) rm.segment = stage_to_device(segment_ids(*cu_seqlens, l), q.device());

  std::vector<RunState> state(mine.runs.size());
  const std::vector<int64_t> q_at = run_offsets(mine);
  auto kv = torch::cat({k, v}, 1);  // [B, 2 Hkv, Lr, D]: k and v travel together
  torch::Tensor unused;             // the last block when no pair uses it (kept in the graph)
  for (int64_t s = 0; s < cp; ++s) {
    if (s > 0) kv = ex.ring_pass(kv, str(what, " k/v hop ", s));
    const SequenceLayout theirs = sequence_layout(l, cp, (rank - s + cp) % cp, ex.mode());
    const std::vector<int64_t> k_at = run_offsets(theirs);
    bool used = false;
    for (size_t qi = 0; qi < mine.runs.size(); ++qi) {
      const TokenRun& qr = mine.runs[qi];
      auto qq = q.narrow(2, q_at[qi], qr.len);
      // Step 0: the query run's own (diagonal) pair first, so the state starts with finite lse.
      std::vector<size_t> order;
      if (s == 0) order.push_back(qi);
      for (size_t ki = 0; ki < theirs.runs.size(); ++ki)
        if (!(s == 0 && ki == qi)) order.push_back(ki);
      for (size_t ki : order) {
        const TokenRun& kr = theirs.runs[ki];
        if (pair_empty(qr, kr)) continue;
        auto [kk, vv] = block_run(kv, k_at[ki], kr.len);
        merge(state[qi], attend_block(qq, kk, vv, pair_mask(rm, qr, kr, q.device()), scale));
        used = true;
      }
    }
    if (s == cp - 1 && !used) unused = kv;
  }
  std::vector<torch::Tensor> outs;
  for (const RunState& st : state) outs.push_back(st.out);
  auto out = (outs.size() == 1 ? outs[0] : torch::cat(outs, 2)).to(q.scalar_type());  // [B, H, Lr, D]
  // Every rank runs the last hop's reverse in backward only if the block enters its graph.
  if (unused.defined()) out = out + (unused.sum() * 0).to(out.scalar_type());
  return out;
}

}  // namespace vlm
