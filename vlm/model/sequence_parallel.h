// Sequence parallelism inside the model: one micro-batch's sequence split over the `cp` ranks
// of a context-parallel group, each rank running the decoder on its share of the tokens. Two
// modes (SequenceMode), chosen by sharding/ (dist.cp_mode):
//   - Ulysses: rank r holds the contiguous chunk r of L / cp tokens; around each attention an
//     all-to-all gives every rank H / cp heads of the whole sequence (seq_to_heads), and a
//     second one returns the result to the chunk (heads_to_seq);
//   - ring: the sequence is cut into 2 cp equal chunks and rank r holds chunks r and
//     2 cp - 1 - r (the load-balanced causal split: every rank gets as many early as late
//     tokens); its queries stay put and the key/value blocks travel around the ring, cp - 1
//     hops per attention (ring_attention.h). No head-count requirement.
//
// The model stays unaware of processes: sharding/ installs a SequenceExchange (the group's
// differentiable all-to-all and ring pass) with VisionLanguageModelImpl::set_sequence_exchange,
// and the model does the rest with it:
//   - VisionLanguageModelImpl::forward (training path) computes what spans the sequence on
//     the whole micro-batch first (embeddings with the image features placed, M-RoPE
//     positions, packing boundaries, the attention mask, the next-token labels), pads the
//     sequence to a multiple of cp (ring: of 2 cp; padding tokens: masked keys, label -100,
//     after every real token, so causal attention never sees them) and hands the decoder this
//     rank's tokens (sequence_layout: one run, or two in ring mode);
//   - each attention layer attends over the whole sequence with the whole mask, by one of the
//     two modes above;
//   - the loss sums this rank's part: the micro-batch's supervised rows, those held by other
//     ranks ignored. Summed over the cp ranks it is the unsplit loss, and so are the gradients
//     that the data-parallel engines (which count the cp ranks as replicas) sum.
// Everything else in the decoder (norms, MLPs, experts) is per token and runs on the rank's
// tokens.
//
// Requirements (Ulysses): the attention heads divide by cp; the key/value heads divide by cp or
// divide cp (fewer kv heads than cp: each is repeated cp / Hkv times before the exchange). Ring
// mode has none for attention. Gated DeltaNet layers (Qwen3.5, gated_delta_net.h) split by
// value heads in either mode (their key heads repeated when fewer than cp): the projections
// run on the rank's tokens, the causal conv and the recurrence on every token of the rank's
// heads, which keeps each head's recurrence whole on one rank.
//
// Names: B batch, L the padded sequence (a multiple of cp, ring: of 2 cp), Ls = L / cp this
// rank's tokens (Lr in ring_attention.h), H heads, D head_dim.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace vlm {

enum class SequenceMode { kUlysses, kRing };
const char* sequence_mode_name(SequenceMode mode);  // "ulysses" | "ring"
// "ulysses" | "ring" -> the mode; anything else throws vlm::Error naming `what`.
SequenceMode parse_sequence_mode(const std::string& name, const std::string& what);

class SequenceExchange {
 public:
  virtual ~SequenceExchange() = default;
  virtual int64_t size() const = 0;  // cp: ranks in the group
  virtual int64_t rank() const = 0;  // this rank's place in it: which tokens it holds
  // How the group splits and attends (the same on every rank of the group).
  virtual SequenceMode mode() const = 0;
  // x: [cp, ...] (chunk j goes to rank j) -> [cp, ...] (chunk j came from rank j), every rank
  // the same shape. Differentiable: the backward is the same exchange of the gradient. Every
  // rank of the group must call it, in the same order.
  virtual torch::Tensor all_to_all(const torch::Tensor& x, const std::string& what) = 0;
  // One hop around the ring: x goes to rank (rank + 1) % cp, and the result is the tensor of
  // the same shape that rank (rank - 1 + cp) % cp sent. Differentiable: the backward sends the
  // gradient the other way. Every rank of the group must call it, in the same order.
  virtual torch::Tensor ring_pass(const torch::Tensor& x, const std::string& what) = 0;
  // The collectives tensor parallelism uses (tensor_parallel.h), rows along dim 0, every rank
  // the same shape, differentiable, every rank of the group in the same order. The defaults
  // are all-to-alls of tp copies / chunks (the same bytes); an exchange over a process group
  // overrides them with the native ops (no tp copies).
  // x [n, ...] -> [size * n, ...]: the ranks' x in rank order. Backward: a reduce-scatter.
  virtual torch::Tensor all_gather(const torch::Tensor& x, const std::string& what);
  // x [size * n, ...] -> [n, ...]: rows [rank n, (rank + 1) n) of the sum over the ranks.
  // Backward: an all-gather.
  virtual torch::Tensor reduce_scatter(const torch::Tensor& x, const std::string& what);
  // x -> the sum over the ranks. Backward: the gradient's sum over the ranks.
  virtual torch::Tensor all_reduce(const torch::Tensor& x, const std::string& what);
};

// Where this rank's chunk lies: tokens [begin, begin + len) of the padded length `padded`.
struct SequenceChunk {
  int64_t padded = 0, begin = 0, len = 0;
};
// The chunk of rank `rank` of `cp` for a sequence of `length` tokens (padded up to a
// multiple of cp): Ulysses' layout.
SequenceChunk sequence_chunk(int64_t length, int64_t cp, int64_t rank);

// The tokens one rank holds in either mode: runs of the padded sequence, in sequence order;
// the rank's local token i is the i-th held position.
struct TokenRun {
  int64_t begin = 0, len = 0;
};
struct SequenceLayout {
  int64_t padded = 0;          // the padded length L
  int64_t len = 0;             // tokens held (the sum of the runs' lengths)
  std::vector<TokenRun> runs;  // Ulysses: [chunk r]; ring: [chunk r, chunk 2 cp - 1 - r] of L / (2 cp)
  std::vector<int64_t> positions() const;  // the global position of each held token: [len]
};
// The layout of rank `rank` of `cp` for a sequence of `length` tokens: Ulysses pads to a
// multiple of cp (the one run is sequence_chunk's), ring to a multiple of 2 cp. A padded length
// gives itself back, so any rank's layout follows from (L, cp, its rank, mode).
SequenceLayout sequence_layout(int64_t length, int64_t cp, int64_t rank, SequenceMode mode);
// x's held tokens along `dim` (size layout.padded) -> size layout.len along dim (the runs concatenated).
torch::Tensor gather_layout(const torch::Tensor& x, int64_t dim, const SequenceLayout& layout);
// The local index of every padded position, -1 where another rank holds it: [L] int64 (host).
torch::Tensor layout_local_index(const SequenceLayout& layout);

// Ulysses around one attention. Before: q [B, H, Ls, D], k / v [B, Hkv, Ls, D] (after the
// rotary; this rank's tokens, every head) -> q [B, H / cp, L, D], k / v [B, max(Hkv, cp) / cp,
// L, D] (every token, this rank's heads [rank * H / cp, (rank + 1) * H / cp) and their kv
// heads), in one all-to-all: q, k and v of a chunk travel together. Checks the head counts.
struct HeadShardedQkv {
  torch::Tensor q, k, v;
};
HeadShardedQkv seq_to_heads(SequenceExchange& ex, const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v, const std::string& what);
// After: o [B, Hc, L, D] (every token, this rank's Hc heads) -> [B, Ls, cp * Hc, D] (this
// rank's tokens, every head).
torch::Tensor heads_to_seq(SequenceExchange& ex, const torch::Tensor& o, const std::string& what);

// A whole sequence gathered from the cp ranks in rank order (each rank's held tokens, as an
// all-to-all returns them) <-> the sequence in position order, along `dim` (size L). Ulysses:
// the same order (x itself); ring: rank r's runs are chunks r and 2 cp - 1 - r. For mixers that
// need every token in order on one rank (Gated DeltaNet's conv and recurrence).
torch::Tensor rank_order_to_sequence(const torch::Tensor& x, int64_t dim, int64_t cp, SequenceMode mode);
torch::Tensor sequence_to_rank_order(const torch::Tensor& x, int64_t dim, int64_t cp, SequenceMode mode);

// Whether a layer of `heads` query and `kv_heads` key/value heads can be split over cp ranks
// ("" if so, else why not, naming them `heads_name` and `kv_name`).
std::string ulysses_heads_problem(int64_t heads, int64_t kv_heads, int64_t cp,
                                  const std::string& heads_name = "attention heads",
                                  const std::string& kv_name = "key/value heads");

}  // namespace vlm
