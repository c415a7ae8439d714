// Activation memory per unit (see activation_memory.h for the per-op accounting).
#include "app/plan/activation_memory.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "vlm/runtime/check.h"
#include "vlm/model/chunked_cross_entropy.h"
#include "vlm/model/lora.h"
#include "vlm/model/vision_split.h"

namespace vlm::app {

namespace {

constexpr double kF = 4.0;  // fp32 bytes

// What trains, read from the model: requires_grad per module path, LoRA per Linear path.
class Trained {
 public:
  explicit Trained(VisionLanguageModelImpl& model) {
    for (const auto& p : model.named_parameters()) {
      params_[p.key()] = p.value().requires_grad();
      if (p.value().requires_grad()) trained_numel_[p.key()] = static_cast<double>(p.value().numel());
    }
    for (const auto& [path, lin] : lora_modules(model)) lora_[path] = lin->lora_options;
  }
  // Does a parameter of the module at `path` (not its adapters) need a gradient?
  bool weight(const std::string& path) const {
    bool found = false, any = false;
    for (auto it = params_.lower_bound(path + "."); it != params_.end() && it->first.rfind(path + ".", 0) == 0; ++it) {
      if (is_lora_param(it->first)) continue;
      found = true;
      any = any || it->second;
    }
    VLM_CHECK(found, "activation plan: the model has no parameters under '", path, "' (hint: a module renamed?)");
    return any;
  }
  // Elements of the parameters under `path` that need a gradient (adapters included).
  double trained_numel(const std::string& path) const {
    double n = 0;
    for (auto it = trained_numel_.lower_bound(path + ".");
         it != trained_numel_.end() && it->first.rfind(path + ".", 0) == 0; ++it)
      n += it->second;
    return n;
  }
  const LoraOptions* lora(const std::string& path) const {
    auto it = lora_.find(path);
    return it == lora_.end() ? nullptr : &it->second;
  }

 private:
  std::map<std::string, bool> params_;
  std::map<std::string, double> trained_numel_;
  std::map<std::string, LoraOptions> lora_;
};

// The running state of one unit's forward, per row: bytes kept so far and whether the
// activation stream needs a gradient.
struct Op {
  const Trained& t;
  double p;      // activation dtype bytes
  double stats;  // LayerNorm statistics element bytes (the input's dtype on the CPU)
  bool cuda;     // CUDA kernels (dropout's mask), else the CPU's
  double kept = 0;
  double per_call = 0;  // bytes kept once per call (not per row)

  // A Linear at `path` on an input of width `in` (rg: the input needs a gradient). Its input
  // is kept by a trained weight or by an adapter without dropout; that is counted once by
  // the caller, which knows whether siblings share the input (q / k / v). Returns whether
  // the output needs a gradient and adds the adapter's own tensors: A's output [r]; with
  // dropout, the dropped input (A's input) and, when the input needs a gradient, the mask
  // (the CPU's dropout multiplies by a scaled noise tensor in the input's dtype; CUDA's
  // fused kernel keeps a bool mask).
  bool linear(const std::string& path, double in, bool rg) {
    const LoraOptions* l = t.lora(path);
    if (l != nullptr) {
      kept += p * static_cast<double>(l->r);
      if (l->dropout > 0) kept += p * in + (rg ? (cuda ? 1.0 : p) * in : 0.0);
    }
    return rg || t.weight(path) || l != nullptr;
  }
  bool keeps_input(const std::string& path) const {
    const LoraOptions* l = t.lora(path);
    return t.weight(path) || (l != nullptr && l->dropout == 0);
  }
  // RMSNorm (layers.cpp) over `w`: x.to(fp32) squared and scaled (kept when x needs a
  // gradient: x itself in fp32, else an fp32 copy; rsqrt), the normalised copy (kept for a
  // trained weight). input_is_new: x was made inside this unit (else the producer counts it).
  // Zero-centred (NormKind::rms_norm_centered, Qwen3.5): the normalised copy stays fp32 (it
  // is multiplied by 1 + w in fp32).
  bool rms(const std::string& path, double w, bool rg, bool input_is_new, double rows_per_stat = 1,
           bool centered = false) {
    if (rg) kept += ((p == kF && !input_is_new) ? 0.0 : kF * w) + kF * rows_per_stat;
    if (rg && centered) per_call += kF * w / rows_per_stat;  // 1 + w, fp32, kept by the product
    const bool tw = t.weight(path);
    if (tw) kept += (centered ? kF : p) * w;
    return rg || tw;
  }
  // LayerNorm: keeps its input and two statistics per row when anything needs a gradient.
  bool layer(const std::string& path, double w, bool rg, bool input_is_new) {
    const bool any = rg || t.weight(path);
    if (any) kept += (input_is_new ? p * w : 0.0) + 2 * stats;
    return any;
  }
  bool norm(bool rms_kind, const std::string& path, double w, bool rg, bool input_is_new) {
    return rms_kind ? rms(path, w, rg, input_is_new) : layer(path, w, rg, input_is_new);
  }
};

// Whether attention over packed segments runs as one flash varlen call (attention.cpp's
// flash_varlen_applies: CUDA, 16-bit activations, head_dim a multiple of 8 up to 256); else
// per group of equal-length segments through SDPA, outputs concatenated.
bool flash_varlen(const Op& o, int64_t head_dim) {
  return o.cuda && o.p == 2 && head_dim % 8 == 0 && head_dim <= 256;
}

bool norm_keeps_input(bool rms_kind, double p, bool rg, bool trained_weight) {
  return rms_kind ? (rg && p == kF) : (rg || trained_weight);
}

// The MLP of a block / layer on an input of width `w` (the normed x, whose own storage the
// caller counts once: it is kept when fc1 / gate / up keep inputs). Children as vlm::Mlp
// names them: gate_proj, up_proj, down_proj | fc1, fc2 | linear_fc1, linear_fc2.
std::string mlp_first(MlpKind type) {
  return type == MlpKind::gated_silu ? ".gate_proj" : type == MlpKind::quick_gelu ? ".fc1" : ".linear_fc1";
}

bool mlp(Op& o, MlpKind type, const std::string& m, double w, double inter, bool rg) {
  if (type == MlpKind::gated_silu) {
    const bool g = o.linear(m + ".gate_proj", w, rg), u = o.linear(m + ".up_proj", w, rg);
    if (g) o.kept += o.p * inter;             // silu's input
    if (u) o.kept += o.p * inter;             // silu(g), kept by the product for u's gradient
    if (g) o.kept += o.p * inter;             // u, kept for silu(g)'s gradient
    if (o.keeps_input(m + ".down_proj")) o.kept += o.p * inter;  // the product
    return o.linear(m + ".down_proj", inter, g || u);
  }
  const std::string fc1 = m + mlp_first(type);
  const std::string fc2 = m + (type == MlpKind::quick_gelu ? ".fc2" : ".linear_fc2");
  const bool h = o.linear(fc1, w, rg);
  if (h) o.kept += (type == MlpKind::quick_gelu ? 2 : 1) * o.p * inter;  // h and sigmoid(1.702 h) | h
  if (o.keeps_input(fc2)) o.kept += o.p * inter;                        // the activation's output
  return o.linear(fc2, inter, h);
}

// A tower block, per patch: its norms and MLP as the tower reports them.
UnitActivation vision_block(const VisionConfig& v, Op o, const VisionUnitLayout& l, bool rg, bool split) {
  const double e = static_cast<double>(v.embed_dim), iv = static_cast<double>(v.intermediate_size);
  const bool rms = l.norm == NormKind::rms_norm;
  const MlpKind type = l.mlp;
  const std::string& b = l.path;
  UnitActivation u;
  u.keeps_input = norm_keeps_input(rms, o.p, rg, o.t.weight(b + ".norm1"));
  const bool n1 = o.norm(rms, b + ".norm1", e, rg, false);
  if (o.keeps_input(b + ".attn.qkv")) o.kept += o.p * e;
  const bool qkv = o.linear(b + ".attn.qkv", e, n1);
  // Per group: the qkv output (v is a view of it), rotated q and k, each group's output, then
  // their concatenation, kept by proj. Flash varlen: rotated q, k, a contiguous v and the
  // kernel's output, which proj keeps itself. Split over a cp group (vision_split.h), per
  // local row: the exchanged q, k, v and the output (measured on the CPU); with flash varlen
  // also the output back from the exchange (proj's input), a tensor of its own.
  const bool varlen = flash_varlen(o, v.head_dim());
  const double attn_rows = split ? (varlen ? 5 : 4) : (varlen ? 4 : 6);
  if (qkv) o.kept += attn_rows * o.p * e + kF * static_cast<double>(v.num_heads);
  if (o.keeps_input(b + ".attn.proj") && (!varlen || !qkv)) o.kept += o.p * e;
  const bool h = o.linear(b + ".attn.proj", e, qkv) || rg;
  const bool n2 = o.norm(rms, b + ".norm2", e, h, true);
  const std::string fc1 = b + ".mlp" + mlp_first(type);
  if (o.keeps_input(fc1) || (type == MlpKind::gated_silu && o.keeps_input(b + ".mlp.up_proj"))) o.kept += o.p * e;
  const bool out = mlp(o, type, b + ".mlp", e, iv, n2) || h;
  u.output_bytes = o.p * e;
  u.kept_bytes = o.kept + u.output_bytes;
  u.needs_grad = out;
  if (out) u.backward_bytes = 3 * o.p * iv;
  return u;
}

// A merger, per merged token: its norm (over each patch, or over the merged vector), the
// first Linear's input, GELU's input and output, the output.
UnitActivation merger(const VisionConfig& v, Op o, const VisionUnitLayout& l, bool rg) {
  const double unit = static_cast<double>(v.merge_unit()), e = static_cast<double>(v.embed_dim);
  const double merged = unit * e;
  const bool rms = l.norm == NormKind::rms_norm, postshuffle = l.postshuffle_norm;
  const std::string norm = l.path + "." + l.norm_name;
  const std::string fc1 = l.path + "." + l.fc1_name, fc2 = l.path + "." + l.fc2_name;
  UnitActivation u;
  u.keeps_input = norm_keeps_input(rms, o.p, rg, o.t.weight(norm));
  Op per_patch = o;
  per_patch.kept = 0;
  const bool n = postshuffle ? o.norm(rms, norm, merged, rg, false) : per_patch.norm(rms, norm, e, rg, false);
  if (!postshuffle) o.kept += unit * per_patch.kept;
  if (o.keeps_input(fc1)) o.kept += o.p * merged;
  const bool h = o.linear(fc1, merged, n);
  if (h) o.kept += o.p * merged;                   // GELU's input
  if (o.keeps_input(fc2)) o.kept += o.p * merged;  // GELU's output
  u.needs_grad = o.linear(fc2, merged, h);
  if (u.needs_grad) u.backward_bytes = 3 * o.p * merged;
  u.output_bytes = o.p * static_cast<double>(v.out_hidden_size);
  u.kept_bytes = o.kept + u.output_bytes;
  return u;
}

// `self_attn` on the normed x (n1: whether it needs a gradient), per token: returns whether
// its output does.
bool attention_mixer(const TextConfig& tc, Op& o, const std::string& a, bool n1, bool packed, int64_t cp, bool ring) {
  const double d = static_cast<double>(tc.hidden_size);
  const double heads = static_cast<double>(tc.num_attention_heads), kvh = static_cast<double>(tc.num_key_value_heads);
  const double hd = heads * static_cast<double>(tc.head_dim()), kvd = kvh * static_cast<double>(tc.head_dim());
  // Ulysses: attention saves the exchanged k / v, whose kv heads are repeated up to cp (ring:
  // the rank's own).
  const double kvd_attn =
      static_cast<double>(ring ? tc.num_key_value_heads : std::max<int64_t>(tc.num_key_value_heads, cp)) *
      static_cast<double>(tc.head_dim());
  if (o.keeps_input(a + ".q_proj") || o.keeps_input(a + ".k_proj") || o.keeps_input(a + ".v_proj")) o.kept += o.p * d;
  bool q = o.linear(a + ".q_proj", d, n1), k = o.linear(a + ".k_proj", d, n1);
  const bool v = o.linear(a + ".v_proj", d, n1);
  // Gated attention in fp32: the query is a view of q_proj's [query | gate] output, so the
  // norm's kept input holds the gate half's storage too.
  if (tc.attn_output_gate && tc.qk_norm && o.p == kF && q) o.kept += kF * hd;
  if (tc.qk_norm) {  // per head: the projection (fp32 or its copy), rsqrt per head row, normed copy
    const bool c = tc.norm == NormKind::rms_norm_centered;
    q = o.rms(a + ".q_norm", hd, q, true, heads, c);
    k = o.rms(a + ".k_norm", kvd, k, true, kvh, c);
  }
  const bool attn = q || k || v;
  if (attn) o.kept += o.p * (2 * hd + 2 * kvd_attn) + kF * heads;  // rotated q, k; v; out; logsumexp
  // Ring over packed rows: each layer's segment ids of the whole row, int64 [cp x local tokens].
  if (attn && ring && packed && cp > 1) o.kept += 8.0 * static_cast<double>(cp);
  // Ulysses: the output comes back through the exchange, a new tensor; ring: the ring's output
  // [B, H, L, D] made o_proj's [B, L, H * D], a copy.
  const bool split = cp > 1;
  // Packed without flash: the per-sample outputs (counted above) are concatenated into
  // o_proj's input, kept when o_proj keeps its input.
  if (attn && packed && !flash_varlen(o, tc.head_dim()) && !split && o.keeps_input(a + ".o_proj")) o.kept += o.p * hd;
  // Ulysses: o_proj's input is the exchanged-back output (without the split, a view of the
  // attention's saved output).
  if (attn && split && !tc.attn_output_gate && o.keeps_input(a + ".o_proj")) o.kept += o.p * hd;
  // Gated attention: sigmoid(gate), the attention output's [B, L, H*D] copy kept by the
  // product (packed without flash: the concatenated outputs, counted above, serve), and the
  // gated output (o_proj's input, a new tensor).
  const bool out_copy = !(packed && !flash_varlen(o, tc.head_dim()));
  if (attn && tc.attn_output_gate)
    o.kept += o.p * hd * (out_copy ? 2 : 1) + (o.keeps_input(a + ".o_proj") ? o.p * hd : 0.0);
  if (!attn && o.keeps_input(a + ".o_proj")) o.kept += o.p * hd;
  return o.linear(a + ".o_proj", hd, attn);
}

// `linear_attn` (vlm/model/gated_delta_net.h) on the normed x, per token: what autograd keeps
// of the projections, the conv, the decays and the chunked rule (fp32 inside), the gated norm.
// pad: the chunk-padded length over the real one (the rule's tensors are per padded token).
bool linear_mixer(const TextConfig& tc, Op& o, const std::string& a, bool n1, double pad) {
  const double d = static_cast<double>(tc.hidden_size), h = static_cast<double>(tc.linear_num_value_heads);
  const double hk = h * static_cast<double>(tc.linear_key_head_dim);    // q / k per value head, repeated
  const double hv = h * static_cast<double>(tc.linear_value_head_dim);  // V
  const double conv = 2 * static_cast<double>(tc.linear_num_key_heads * tc.linear_key_head_dim) + hv;
  const double c = 64, state = hk * static_cast<double>(tc.linear_value_head_dim);  // chunk; H Dk Dv
  if (o.keeps_input(a + ".in_proj_qkv") || o.keeps_input(a + ".in_proj_z") || o.keeps_input(a + ".in_proj_b") ||
      o.keeps_input(a + ".in_proj_a"))
    o.kept += o.p * d;
  bool any = o.linear(a + ".in_proj_qkv", d, n1);
  any = o.linear(a + ".in_proj_z", d, n1) || any;
  any = o.linear(a + ".in_proj_b", d, n1) || any;
  any = o.linear(a + ".in_proj_a", d, n1) || any;
  any = any || o.t.weight(a + ".conv1d") || o.t.weight(a);
  if (!any) return o.linear(a + ".out_proj", hv, false);
  o.kept += 2 * o.p * conv;                 // the conv's input (state-prefixed) and SiLU's input
  o.kept += kF * hv + o.p * h + 4 * kF * h;  // z (fp32, SiLU's input); sigmoid(b); softplus in / out
  o.kept += 2 * kF * hk + 2 * kF * h;        // q, k before their L2 norm; the norms' rsqrt
  // The chunked rule, per padded token: padded q, k, v, beta; k*beta, the UT solves' outputs
  // (new values, decayed keys), the decayed q and k; the chunk-square matrices (pair decays,
  // two products, the UT system, the intra-chunk scores); three decay vectors; the corrected
  // values; one fp32 state [H, Dk, Dv] per chunk.
  o.kept += pad * (kF * (6 * hk + 3 * hv + 5 * h * c + 4 * h) + kF * state / c);
  // The gated norm: its fp32 input and rsqrt, the normed copy (trained weight), the weighted
  // product and SiLU(z); then out_proj's input.
  o.kept += kF * hv + kF * h + (o.t.weight(a + ".norm") ? o.p * hv : 0.0) + o.p * hv + kF * hv;
  if (o.keeps_input(a + ".out_proj")) o.kept += o.p * hv;
  return o.linear(a + ".out_proj", hv, true);
}

// A sparse layer's `mlp` (vlm/model/moe.h) on the normed x (counted by the caller), per
// token: the router's fp32 probabilities (softmax keeps its output), top-k values, their sum
// and int64 indices; per routed row (k per token): the sort order and token index (int64),
// the gathered routing weight, the weighted expert output (index_add keeps its source), the
// expert output (kept by the weight product), gate_up's output and silu(g); with trained
// experts also the gathered input and the product (down's input). Then the shared expert as
// a dense SwiGLU plus its sigmoid gate and output.
bool moe_block(const TextConfig& tc, Op& o, const std::string& m, double d, bool rg) {
  const double e = static_cast<double>(tc.num_experts), k = static_cast<double>(tc.num_experts_per_tok);
  const double inter = static_cast<double>(tc.moe_intermediate_size), i64 = 8;
  const bool r = o.linear(m + ".gate", d, rg);
  const bool experts = o.t.weight(m + ".experts");
  if (r) o.kept += kF * e + kF * (k + 1) + i64 * k;
  const bool any = r || experts;
  if (any) o.kept += k * (2 * i64 + o.p + 2 * o.p * d + 3 * o.p * inter);
  if (experts) o.kept += k * (o.p * d + o.p * inter);
  bool shared = false;
  if (tc.shared_expert_intermediate_size > 0) {
    shared = mlp(o, MlpKind::gated_silu, m + ".shared_expert", d,
                 static_cast<double>(tc.shared_expert_intermediate_size), rg);
    shared = o.linear(m + ".shared_expert_gate", d, rg) || shared;
    if (shared) o.kept += o.p * d + o.p;
  }
  return any || shared;
}

UnitActivation decoder_layer(const TextConfig& tc, Op o, const std::string& l, int64_t index, bool rg, bool packed,
                             double pad, int64_t cp, bool ring) {
  const double d = static_cast<double>(tc.hidden_size), inter = static_cast<double>(tc.intermediate_size);
  UnitActivation u;
  u.keeps_input = norm_keeps_input(true, o.p, rg, o.t.weight(l + ".input_layernorm"));
  const bool c = tc.norm == NormKind::rms_norm_centered;
  const bool n1 = o.rms(l + ".input_layernorm", d, rg, false, 1, c);
  const bool h = (tc.mixer(index) == MixerKind::linear_attention ? linear_mixer(tc, o, l + ".linear_attn", n1, pad)
                                                                  : attention_mixer(tc, o, l + ".self_attn", n1, packed, cp, ring)) ||
                 rg;
  const bool n2 = o.rms(l + ".post_attention_layernorm", d, h, true, 1, c);
  if (tc.sparse_layer(index)) {
    const std::string m = l + ".mlp";
    if (o.keeps_input(m + ".gate") || o.t.weight(m + ".experts") ||
        (tc.shared_expert_intermediate_size > 0 && o.keeps_input(m + ".shared_expert.gate_proj")))
      o.kept += o.p * d;
    u.needs_grad = moe_block(tc, o, m, d, n2) || h;
    // Backward transients: per routed row the gradients of the weighted output, the expert
    // output and the gathered rows [d each], of gate_up's output and the product [3I]; the
    // shared expert's as a dense MLP's.
    if (u.needs_grad)
      u.backward_bytes = 3 * o.p * (static_cast<double>(tc.num_experts_per_tok) *
                                        static_cast<double>(tc.hidden_size + tc.moe_intermediate_size) +
                                    static_cast<double>(tc.shared_expert_intermediate_size));
  } else {
    if (o.keeps_input(l + ".mlp.gate_proj") || o.keeps_input(l + ".mlp.up_proj")) o.kept += o.p * d;
    u.needs_grad = mlp(o, MlpKind::gated_silu, l + ".mlp", d, inter, n2) || h;
    if (u.needs_grad) u.backward_bytes = 3 * o.p * inter;
  }
  // Ulysses' backward: the q / k / v gradients' send and receive buffers of the exchange. Ring's:
  // dq and the output's gradient in fp32, the held and the received block and their fp32
  // gradients (one block pair's scores, quadratic in the run length, are not counted).
  const double hd = static_cast<double>(tc.num_attention_heads * tc.head_dim());
  const double kvd = static_cast<double>(tc.num_key_value_heads * tc.head_dim());
  if (cp > 1 && u.needs_grad && tc.mixer(index) == MixerKind::full_attention)
    u.backward_bytes += ring ? kF * 2 * hd + (2 * o.p + 2 * kF) * 2 * kvd
                             : 2 * o.p *
                                   static_cast<double>(tc.num_attention_heads +
                                                       2 * std::max<int64_t>(tc.num_key_value_heads, cp)) *
                                   static_cast<double>(tc.head_dim());
  u.output_bytes = o.p * d;
  u.kept_bytes = o.kept + u.output_bytes;
  u.per_call_bytes = o.per_call;
  return u;
}

// Pipeline parallelism: the rows of the model's stage (vlm/model/pipeline_stage.h), in call
// order, their inputs renumbered. The schedule's slots (sharding/parallel/pipeline.h) keep a
// later stage's received input [B, L, d] (stream_bytes, counted as a row "pipeline.input" of its
// own) and an earlier stage's output (a row "pipeline.output" that keeps its input) until the
// micro-batch's backward. The tower's rotary tables (vision_shared) stay on stage 0, the loss's
// transients on the last stage.
void keep_stage(ActivationPlan& plan, const PipelineStage& stage, double stream_bytes, double vision_shared) {
  std::vector<UnitActivation> kept;
  std::vector<int> index(plan.units.size(), -1);
  if (!stage.first()) {
    UnitActivation in;
    in.path = "pipeline.input";
    in.kept_bytes = stream_bytes;  // not an output: kept whether or not the first layer keeps it
    in.needs_grad = true;
    kept.push_back(in);
  }
  for (size_t i = 0; i < plan.units.size(); ++i) {
    UnitActivation u = plan.units[i];
    if (!stage.runs(u.path)) continue;
    u.input_from = u.input_from >= 0 ? index[static_cast<size_t>(u.input_from)] : -1;
    index[i] = static_cast<int>(kept.size());
    kept.push_back(u);
  }
  if (!stage.last()) {
    UnitActivation out;
    out.path = "pipeline.output";
    out.keeps_input = true;
    out.input_from = static_cast<int>(kept.size()) - 1;
    kept.push_back(out);
    plan.head_chunk_bytes = plan.head_backward_bytes = 0;
  }
  if (!stage.first()) plan.shared_bytes -= vision_shared;
  plan.units = std::move(kept);
}

UnitActivation scaled(std::string path, UnitActivation u, double rows, int input_from) {
  u.path = std::move(path);
  u.kept_bytes = u.kept_bytes * rows + u.per_call_bytes;
  u.output_bytes *= rows;
  u.backward_bytes *= rows;
  u.input_from = input_from;
  return u;
}

}  // namespace

ActivationPlan plan_activations(VisionLanguageModelImpl& model, const MicroBatchShape& shape, torch::Dtype dtype,
                                AttentionPath path) {
  VLM_CHECK(shape.rows >= 1 && shape.seq_len >= 1 && shape.patches >= 0 && shape.loss_rows >= 0 && shape.cp >= 1,
            "activation plan: expected rows, seq_len >= 1 and patches, loss_rows >= 0, got rows ", shape.rows,
            ", seq_len ", shape.seq_len, ", patches ", shape.patches, ", loss_rows ", shape.loss_rows);
  const VlmConfig& cfg = model.cfg;
  const Trained t(model);
  const double p = static_cast<double>(c10::elementSize(dtype));
  const bool cuda = path == AttentionPath::cuda;
  const Op op{t, p, cuda ? kF : p, cuda};
  const auto& v = cfg.vision;
  const auto& tc = cfg.text;
  // No image: the dummy 1-token image still runs (its graph stays alive through the loss's
  // zero term). Context parallelism: the tower's rows are this rank's run of the patches padded
  // to a multiple of cp x merge^2 (vlm/model/vision_split.h), when its heads divide by cp.
  const int64_t all_patches = shape.patches > 0 ? shape.patches : v.merge_unit();
  const bool vsplit = vision_splits(v.num_heads, shape.cp);
  const int64_t split_step = shape.cp * v.merge_unit();
  const double patches = static_cast<double>(
      vsplit ? (all_patches + split_step - 1) / split_step * v.merge_unit() : all_patches);
  const double merged = patches / static_cast<double>(v.merge_unit());
  const double tokens = static_cast<double>(shape.tokens());
  const double chunk = static_cast<double>(shape.decoder_tokens());  // this rank's decoder tokens
  const double e = static_cast<double>(v.embed_dim), d = static_cast<double>(tc.hidden_size);

  ActivationPlan plan;
  auto& units = plan.units;
  auto add = [&](std::string name, UnitActivation u, double rows, int from) {
    units.push_back(scaled(std::move(name), u, rows, from));
    return static_cast<int>(units.size()) - 1;
  };
  // The tower's units, as it reports them; they come first, so a unit's `input` indexes
  // plan.units as well.
  bool tower_grad = false;
  for (const VisionUnitLayout& l : model.visual->unit_layouts("visual")) {
    const bool rg = l.input >= 0 && units[static_cast<size_t>(l.input)].needs_grad;
    UnitActivation u;
    double rows = patches;
    switch (l.kind) {
      case VisionUnitLayout::Kind::patch_embed:  // keeps pixel_values (the batch's own) for a
      case VisionUnitLayout::Kind::table_add:    // trained projection; x + table: a new sum
        u.output_bytes = u.kept_bytes = p * e;
        u.needs_grad = rg || t.weight(l.path);
        break;
      case VisionUnitLayout::Kind::block:
        u = vision_block(v, op, l, rg, vsplit);
        tower_grad = tower_grad || u.needs_grad;
        break;
      case VisionUnitLayout::Kind::merger:
        u = merger(v, op, l, rg);
        rows = merged;
        break;
    }
    add(l.path, u, rows, l.input);
  }
  VLM_CHECK(!units.empty(), "activation plan: the vision tower reports no units");
  const UnitActivation mg = units.back();  // the tower's output: its last unit

  UnitActivation emb;  // the embeddings (with images: the masked_scatter result replacing them)
  emb.output_bytes = emb.kept_bytes = p * d;
  emb.needs_grad = t.weight("model.embed_tokens") || mg.needs_grad;
  // Context parallelism: the chunk's gradient comes back as the whole micro-batch's [B, L, d]
  // (zero outside the chunk) through the copy and the narrow.
  if (shape.cp > 1 && emb.needs_grad) emb.backward_bytes = p * d * tokens / chunk;
  int prev = add("model.embed_tokens", emb, chunk, -1);
  // Gated DeltaNet chunks of 64 tokens: each row padded to whole chunks; packed, each sample
  // is (half a chunk expected per sample).
  const double seq = static_cast<double>(shape.seq_len);
  const double pad = shape.packed ? (seq + 32.0 * static_cast<double>(std::max<int64_t>(shape.samples, 1))) / seq
                                  : std::ceil(seq / 64.0) * 64.0 / seq;
  bool rg = emb.needs_grad;
  for (int64_t i = 0; i < tc.num_hidden_layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i);
    const UnitActivation layer = decoder_layer(tc, op, l, i, rg, shape.packed, pad, shape.cp, shape.cp_ring);
    prev = add(l, layer, chunk, prev);
    rg = layer.needs_grad;
  }
  Op fo = op;
  UnitActivation fn;
  fn.keeps_input = norm_keeps_input(true, p, rg, t.weight("model.norm"));
  fn.needs_grad = fo.rms("model.norm", d, rg, false, 1, tc.norm == NormKind::rms_norm_centered);
  fn.output_bytes = p * d;
  fn.kept_bytes = fo.kept + fn.output_bytes;
  fn.per_call_bytes = fo.per_call;
  add("model.norm", fn, chunk, prev);
  UnitActivation head;  // the supervised rows of the hidden states, kept by the loss
  head.kept_bytes = p * d;
  add("lm_head", head, static_cast<double>(shape.loss_rows), -1);

  // A unit's backward working set beyond its parameters' gradients, which the step's plan
  // counts apart (app/plan/step_memory.h): measured, a trained decoder layer's backward peaks at
  // about its parameter gradients (its saved tensors free as fast as new gradients come),
  // a LoRA layer's at three MLP-width tensors.
  for (auto& u : units) u.backward_bytes = std::max(0.0, u.backward_bytes - p * t.trained_numel(u.path));

  // Text rotary cos / sin [B, L, R] (R rotated dims; activation dtype), M-RoPE ids [3, B, L] int64, the image
  // token mask; vision rotary cos / sin [S, Dv] fp32 (kept by the rotations when the tower
  // builds a graph).
  const double vision_shared = tower_grad ? patches * 2 * kF * static_cast<double>(v.head_dim()) : 0.0;
  plan.shared_bytes = chunk * 2 * p * static_cast<double>(tc.rotary_dim()) + tokens * (24 + 1) + vision_shared;
  // Loss chunk: logits [m, V] in the activation dtype, their fp32 upcast, fp32 log-softmax.
  const double vocab = static_cast<double>(tc.vocab_size);
  const double m =
      std::min<double>(static_cast<double>(std::max<int64_t>(shape.loss_rows, 1)), cross_entropy_chunk_rows(tc.vocab_size));
  plan.head_chunk_bytes = m * vocab * (p + (p < kF ? kF : 0.0) + kF);
  // Backward: the chunk recomputed with its gradient; for a trained head the fp32 weight
  // gradient [V, d] alongside (then alongside its cast to the weight's dtype).
  const bool head_trains = t.weight(cfg.tie_word_embeddings ? "model.embed_tokens" : "lm_head");
  const double recompute = plan.head_chunk_bytes + m * vocab * kF;
  plan.head_backward_bytes =
      head_trains ? vocab * d * kF + std::max(recompute, p < kF ? p * vocab * d : 0.0) : recompute;
  // The stream between stages: [B, L, d], under tensor parallelism the rank's chunk.
  if (!model.pipeline_stage().whole())
    keep_stage(plan, model.pipeline_stage(), p * d * tokens / static_cast<double>(std::max<int64_t>(1, tc.tensor_parallel)),
               vision_shared);
  return plan;
}

namespace {

// Is unit i's output kept at the end of the forward: does a unit reading it keep it (by its
// own forward, or by activation checkpointing, which keeps every checkpointed unit's input)?
bool output_kept(const std::vector<UnitActivation>& units, size_t i,
                 const std::function<bool(const std::string&)>& ckpt) {
  for (const auto& u : units)
    if (u.input_from == static_cast<int>(i) && (u.keeps_input || ckpt(u.path))) return true;
  return false;
}

double unit_bytes(const std::vector<UnitActivation>& units, size_t i,
                  const std::function<bool(const std::string&)>& ckpt) {
  const auto& u = units[i];
  const double out = output_kept(units, i, ckpt) ? u.output_bytes : 0.0;
  return ckpt(u.path) ? out : u.kept_bytes - u.output_bytes + out;
}

}  // namespace

double ActivationPlan::forward_bytes(const std::function<bool(const std::string&)>& ckpt) const {
  double total = shared_bytes;
  for (size_t i = 0; i < units.size(); ++i) total += unit_bytes(units, i, ckpt);
  return total;
}

double ActivationPlan::unit_forward_bytes(const std::string& path,
                                          const std::function<bool(const std::string&)>& ckpt) const {
  for (size_t i = 0; i < units.size(); ++i)
    if (units[i].path == path) return unit_bytes(units, i, ckpt);
  return 0.0;
}

double ActivationPlan::head_peak_bytes(const std::function<bool(const std::string&)>& ckpt) const {
  return forward_bytes(ckpt) + std::max(head_chunk_bytes, head_backward_bytes);
}

double ActivationPlan::units_peak_bytes(const std::function<bool(const std::string&)>& ckpt) const {
  // u's backward: what the units before it keep, its own set (all of it again when
  // checkpointed) and its working set.
  double peak = 0, before = shared_bytes;
  for (size_t i = 0; i < units.size(); ++i) {
    const auto& u = units[i];
    const double own = unit_bytes(units, i, ckpt);
    peak = std::max(peak, before + (ckpt(u.path) ? u.kept_bytes : own) + u.backward_bytes);
    before += own;
  }
  return peak;
}

double ActivationPlan::peak_bytes(const std::function<bool(const std::string&)>& ckpt) const {
  return std::max(head_peak_bytes(ckpt), units_peak_bytes(ckpt));
}

}  // namespace vlm::app
