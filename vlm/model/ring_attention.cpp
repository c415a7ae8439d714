#include "vlm/model/ring_attention.h"

#include <algorithm>
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


// The scores of one block pair in fp32: q [B, H, n, D], k [B, Hkv, m, D] -> [B, Hkv, G, n, m]
// (G = H / Hkv query heads per kv head), -inf where the mask forbids the pair.
torch::Tensor block_scores(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& mask, double scale) {
  const int64_t b = q.size(0), h = q.size(1), n = q.size(2), d = q.size(3), hkv = k.size(1);
  auto qg = q.to(torch::kFloat32).reshape({b, hkv, h / hkv, n, d});
  auto s = torch::matmul(qg, k.to(torch::kFloat32).unsqueeze(2).transpose(-1, -2)) * scale;
  return mask.defined() ? s.masked_fill(mask.logical_not(), kNegInf) : s;
}

// Query rows per tile of a block pair: the fp32 scores of a tile ([B, H, rows, m]) stay under
// tile_bytes, so a pair's transient memory does not grow with the square of the run length.
int64_t tile_rows(const torch::Tensor& q, int64_t m, int64_t tile_bytes) {
  const int64_t row = 4 * q.size(0) * q.size(1) * m;
  return std::max<int64_t>(1, tile_bytes / std::max<int64_t>(row, 1));
}
// The mask's rows [at, at + n) (a pair_mask: [B or 1, 1, 1, rows or 1, m]; one row broadcasts,
// undefined stays so).
torch::Tensor mask_rows(const torch::Tensor& mask, int64_t at, int64_t n) {
  return mask.defined() && mask.size(3) > 1 ? mask.narrow(3, at, n) : mask;
}

// One block's forward on a tile of query rows: o fp32 [B, H, n, D] (0 on rows that see no key
// of the block) and its lse fp32 [B, H, n] (-inf there).
BlockResult tile_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& mask, double scale) {
  const int64_t b = q.size(0), h = q.size(1), n = q.size(2), d = q.size(3);
  auto scores = block_scores(q, k, mask, scale);
  auto mx = scores.amax(-1, /*keepdim=*/true);
  mx = torch::where(torch::isinf(mx), torch::zeros_like(mx), mx);  // rows with no key: exp(-inf) = 0
  auto e = torch::exp(scores - mx);
  auto sum = e.sum(-1, /*keepdim=*/true);
  auto seen = sum > 0;
  auto safe = torch::where(seen, sum, torch::ones_like(sum));
  auto o = torch::matmul(e / safe, v.to(torch::kFloat32).unsqueeze(2));  // [B, Hkv, G, n, D]
  auto lse = torch::where(seen, mx + torch::log(safe), torch::full({}, kNegInf, sum.options()));
  return {o.reshape({b, h, n, d}), lse.reshape({b, h, n})};
}

// One block's forward, tile by tile of query rows.
BlockResult block_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& mask, double scale, int64_t tile_bytes) {
  const int64_t n = q.size(2), t = tile_rows(q, k.size(2), tile_bytes);
  if (t >= n) return tile_forward(q, k, v, mask, scale);
  std::vector<torch::Tensor> os, lses;
  for (int64_t at = 0; at < n; at += t) {
    const int64_t len = std::min(t, n - at);
    auto r = tile_forward(q.narrow(2, at, len), k, v, mask_rows(mask, at, len), scale);
    os.push_back(r.o), lses.push_back(r.lse);
  }
  return {torch::cat(os, 2), torch::cat(lses, 2)};
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

// One block's backward against the whole result (flash attention's rule: the probabilities
// recomputed from the final lse). q, dout: [B, H, n, D]; lse, delta (rowsum(dout * out)):
// [B, H, n] fp32; k / v: [B, Hkv, m, D]. Adds to dq [B, H, n, D] and dk / dv [B, Hkv, m, D]
// (fp32 views).
void tile_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
                   double scale, const torch::Tensor& dout, const torch::Tensor& lse, const torch::Tensor& delta,
                   torch::Tensor dq, torch::Tensor dk, torch::Tensor dv) {
  const int64_t b = q.size(0), h = q.size(1), n = q.size(2), d = q.size(3), hkv = k.size(1), g = h / hkv;
  auto p = torch::exp(block_scores(q, k, mask, scale) - lse.reshape({b, hkv, g, n, 1}));  // masked: 0
  auto go = dout.reshape({b, hkv, g, n, d});
  dv.add_((p.transpose(-1, -2).matmul(go)).sum(2));                               // [B, Hkv, m, D]
  auto dp = go.matmul(v.to(torch::kFloat32).unsqueeze(2).transpose(-1, -2));       // [B, Hkv, G, n, m]
  auto ds = p * (dp - delta.reshape({b, hkv, g, n, 1})) * scale;
  dq.add_(ds.matmul(k.to(torch::kFloat32).unsqueeze(2)).reshape({b, h, n, d}));
  dk.add_((ds.transpose(-1, -2).matmul(q.to(torch::kFloat32).reshape({b, hkv, g, n, d}))).sum(2));
}

// The same, tile by tile of query rows (dq's rows per tile, dk / dv summed over the tiles).
void block_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
                    double scale, const torch::Tensor& dout, const torch::Tensor& lse, const torch::Tensor& delta,
                    const torch::Tensor& dq, const torch::Tensor& dk, const torch::Tensor& dv, int64_t tile_bytes) {
  const int64_t n = q.size(2), t = tile_rows(q, k.size(2), tile_bytes);
  for (int64_t at = 0; at < n; at += t) {
    const int64_t len = std::min(t, n - at);
    tile_backward(q.narrow(2, at, len), k, v, mask_rows(mask, at, len), scale, dout.narrow(2, at, len),
                  lse.narrow(2, at, len), delta.narrow(2, at, len), dq.narrow(2, at, len), dk, dv);
  }
}

// The block pairs of one ring step, in compute order: (query run, key run) of this rank's
// layout and the block owner's, causally empty pairs left out; step 0 puts each query run's
// own (diagonal) pair first, so the running state starts with finite lse.
std::vector<std::pair<size_t, size_t>> step_pairs(const SequenceLayout& mine, const SequenceLayout& theirs, int64_t s) {
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t qi = 0; qi < mine.runs.size(); ++qi) {
    std::vector<size_t> order;
    if (s == 0) order.push_back(qi);
    for (size_t ki = 0; ki < theirs.runs.size(); ++ki)
      if (!(s == 0 && ki == qi)) order.push_back(ki);
    for (size_t ki : order)
      if (!pair_empty(mine.runs[qi], theirs.runs[ki])) pairs.emplace_back(qi, ki);
  }
  return pairs;
}

SequenceExchange& exchange_at(int64_t address) {
  return *reinterpret_cast<SequenceExchange*>(static_cast<intptr_t>(address));
}

// The ring as one autograd node: saves this rank's q, k, v, the output and its lse (no
// received block); backward sends the blocks around again with their gradients.
struct RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
  // rm: not tensor arguments (apply would take them for differentiable inputs, and either
  // may be undefined); kept in saved_data.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const RingMasks& rm, int64_t ex_address, double scale,
                               int64_t tile_bytes, const std::string& what) {
    SequenceExchange& ex = exchange_at(ex_address);
    const int64_t cp = ex.size(), rank = ex.rank(), l = q.size(2) * cp;
    const SequenceLayout mine = sequence_layout(l, cp, rank, ex.mode());
    const std::vector<int64_t> q_at = run_offsets(mine);
    std::vector<RunState> state(mine.runs.size());
    auto kv = torch::cat({k, v}, 1);  // [B, 2 Hkv, Lr, D]: k and v travel together
    for (int64_t s = 0; s < cp; ++s) {
      if (s > 0) kv = ex.ring_pass(kv, str(what, " k/v hop ", s));
      const SequenceLayout theirs = sequence_layout(l, cp, (rank - s + cp) % cp, ex.mode());
      const std::vector<int64_t> k_at = run_offsets(theirs);
      for (const auto& [qi, ki] : step_pairs(mine, theirs, s)) {
        const TokenRun &qr = mine.runs[qi], &kr = theirs.runs[ki];
        auto [kk, vv] = block_run(kv, k_at[ki], kr.len);
        merge(state[qi], block_forward(q.narrow(2, q_at[qi], qr.len), kk, vv, pair_mask(rm, qr, kr, q.device()), scale,
                                       tile_bytes));
      }
    }
    std::vector<torch::Tensor> outs, lses;
    for (const RunState& st : state) outs.push_back(st.out), lses.push_back(st.lse);
    auto out = torch::cat(outs, 2).to(q.scalar_type());  // [B, H, Lr, D]
    ctx->save_for_backward({q, k, v, out, torch::cat(lses, 2)});
    ctx->saved_data["key_mask"] = rm.key_mask;
    ctx->saved_data["segment"] = rm.segment;
    ctx->saved_data["ex"] = ex_address;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["tile_bytes"] = tile_bytes;
    ctx->saved_data["what"] = what;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const RingMasks rm{ctx->saved_data["key_mask"].toTensor(), ctx->saved_data["segment"].toTensor()};
    SequenceExchange& ex = exchange_at(ctx->saved_data["ex"].toInt());
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t tile_bytes = ctx->saved_data["tile_bytes"].toInt();
    const std::string what = ctx->saved_data["what"].toStringRef() + " (backward)";
    const int64_t cp = ex.size(), rank = ex.rank(), hkv = k.size(1), l = q.size(2) * cp;
    // grad_out[0] may be undefined (no gradient reached the output): zeros, and every rank
    // still runs the hops.
    auto dout = grad_out[0].defined() ? grad_out[0].to(torch::kFloat32) : torch::zeros_like(out, torch::kFloat32);
    auto delta = (dout * out.to(torch::kFloat32)).sum(-1);  // [B, H, Lr]
    auto dq = torch::zeros_like(q, torch::kFloat32);
    const SequenceLayout mine = sequence_layout(l, cp, rank, ex.mode());
    const std::vector<int64_t> q_at = run_offsets(mine);
    auto kv = torch::cat({k, v}, 1);
    auto dkv = torch::zeros_like(kv, torch::kFloat32);  // the held block's gradient, gathered on its way
    for (int64_t s = 0; s < cp; ++s) {
      if (s > 0) {
        kv = ex.ring_pass(kv, str(what, " k/v hop ", s));
        dkv = ex.ring_pass(dkv, str(what, " dk/dv hop ", s));
      }
      const SequenceLayout theirs = sequence_layout(l, cp, (rank - s + cp) % cp, ex.mode());
      const std::vector<int64_t> k_at = run_offsets(theirs);
      for (const auto& [qi, ki] : step_pairs(mine, theirs, s)) {
        const TokenRun &qr = mine.runs[qi], &kr = theirs.runs[ki];
        auto [kk, vv] = block_run(kv, k_at[ki], kr.len);
        auto [dk, dv] = block_run(dkv, k_at[ki], kr.len);
        block_backward(q.narrow(2, q_at[qi], qr.len), kk, vv, pair_mask(rm, qr, kr, q.device()), scale,
                       dout.narrow(2, q_at[qi], qr.len), lse.narrow(2, q_at[qi], qr.len),
                       delta.narrow(2, q_at[qi], qr.len), dq.narrow(2, q_at[qi], qr.len), dk, dv, tile_bytes);
      }
    }
    if (cp > 1) dkv = ex.ring_pass(dkv, str(what, " dk/dv home"));  // the block held last belongs to rank + 1
    return {dq.to(q.scalar_type()), dkv.narrow(1, 0, hkv).to(k.scalar_type()),
            dkv.narrow(1, hkv, hkv).to(v.scalar_type()), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor ring_attention(SequenceExchange& ex, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& key_mask,
                             const std::vector<int64_t>* cu_seqlens, double scale, const std::string& what,
                             int64_t tile_bytes) {
  const int64_t cp = ex.size();
  const int64_t b = q.size(0), h = q.size(1), lr = q.size(2), hkv = k.size(1), l = lr * cp;
  VLM_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && k.size(0) == b && k.size(2) == lr && k.size(3) == q.size(3) &&
                h % hkv == 0,
            what, ": expected q [B, H, Lr, D] and k / v [B, Hkv, Lr, D] with H a multiple of Hkv, got q ", q.sizes(),
            ", k ", k.sizes(), ", v ", v.sizes());
  const SequenceLayout mine = sequence_layout(l, cp, ex.rank(), ex.mode());
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
  return RingAttentionFunction::apply(q, k, v, rm, static_cast<int64_t>(reinterpret_cast<intptr_t>(&ex)), scale,
                                      tile_bytes, what);
}

}  // namespace vlm
