#include "vlm/families/qwen3_vision.h"

#include <algorithm>
#include <cmath>

#include "vlm/runtime/check.h"
#include "vlm/model/vision_split.h"
#include "vlm/model/rotary.h"
#include "vlm/families/qwen2_vision.h"
#include "vlm/model/recompute_tail.h"
#include "vlm/runtime/device_staging.h"

namespace vlm {

Qwen3VisionBlockImpl::Qwen3VisionBlockImpl(const VisionConfig& v, const torch::TensorOptions& opts) {
  norm1 = register_module("norm1", Norm(v.norm, v.embed_dim, v.norm_eps, opts));
  norm2 = register_module("norm2", Norm(v.norm, v.embed_dim, v.norm_eps, opts));
  attn = register_module("attn", VisionAttention(v.embed_dim, v.num_heads, opts));
  mlp = register_module("mlp", Mlp(v.mlp, v.embed_dim, v.intermediate_size, /*bias=*/true, opts));
}

torch::Tensor Qwen3VisionBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                            const torch::Tensor& sin, const std::vector<int64_t>& cu,
                                            SequenceExchange* sp) {
  auto h = x + attn(norm1(x), cos, sin, cu, sp);
  return residual_linear(this, h, mlp->hidden(norm2(h)), mlp->out_proj());
}

Qwen3MergerImpl::Qwen3MergerImpl(const VisionConfig& v, bool postshuffle_norm, const torch::TensorOptions& opts)
    : merged_dim(v.embed_dim * v.merge_unit()), postshuffle(postshuffle_norm) {
  norm = register_module("norm", Norm(NormKind::layer_norm, postshuffle ? merged_dim : v.embed_dim, v.norm_eps, opts));
  linear_fc1 = register_module("linear_fc1", Linear(merged_dim, merged_dim, true, opts));
  linear_fc2 = register_module("linear_fc2", Linear(merged_dim, v.out_hidden_size, true, opts));
}

torch::Tensor Qwen3MergerImpl::forward(const torch::Tensor& x) {
  const int64_t unit = merged_dim / x.size(1);
  VLM_CHECK(x.dim() == 2 && x.size(0) % unit == 0, "merger input: expected [S, ", x.size(1),
            "] with S divisible by ", unit, ", got ", x.sizes());
  auto h = postshuffle ? norm(x.reshape({-1, merged_dim})) : norm(x).reshape({-1, merged_dim});
  return linear_fc2(torch::gelu(linear_fc1(h)));  // exact (erf) GELU
}

PosTaps qwen3_position_taps(const torch::Tensor& grid_thw, int64_t side, int64_t merge) {
  auto g = grid_thw.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* d = g.data_ptr<int64_t>();
  int64_t total = 0;
  for (int64_t i = 0; i < g.size(0); ++i) total += d[3 * i] * d[3 * i + 1] * d[3 * i + 2];
  auto index = torch::empty({total, 4}, torch::kInt64);
  auto weight = torch::empty({total, 4}, torch::kFloat32);
  int64_t* ip = index.data_ptr<int64_t>();
  float* wp = weight.data_ptr<float>();
  // One axis: source coordinate in fp32 (index * (side - 1) / max(size - 1, 1)), the taps
  // floor and floor + 1 clamped to the table, weights max(0, 1 - |src - tap|).
  auto axis = [side](int64_t pos, int64_t size, int64_t taps[2], float w[2]) {
    const float src = static_cast<float>(pos) * static_cast<float>(side - 1) /
                      static_cast<float>(std::max<int64_t>(size - 1, 1));
    const float fl = std::floor(src);
    for (int k = 0; k < 2; ++k) {
      taps[k] = std::clamp<int64_t>(static_cast<int64_t>(fl) + k, 0, side - 1);
      const float dist = std::fabs(src - fl - static_cast<float>(k));
      w[k] = std::max(1.0f - dist, 0.0f);
    }
  };
  int64_t row = 0;
  for (int64_t i = 0; i < g.size(0); ++i) {
    const int64_t t = d[3 * i], h = d[3 * i + 1], w = d[3 * i + 2];
    for (int64_t tt = 0; tt < t; ++tt)
      for (int64_t bh = 0; bh < h / merge; ++bh)
        for (int64_t bw = 0; bw < w / merge; ++bw)
          for (int64_t mh = 0; mh < merge; ++mh)
            for (int64_t mw = 0; mw < merge; ++mw, ++row) {
              int64_t th[2], tw[2];
              float wh[2], ww[2];
              axis(bh * merge + mh, h, th, wh);
              axis(bw * merge + mw, w, tw, ww);
              for (int a = 0; a < 2; ++a)
                for (int b = 0; b < 2; ++b) {
                  ip[row * 4 + a * 2 + b] = th[a] * side + tw[b];
                  wp[row * 4 + a * 2 + b] = wh[a] * ww[b];
                }
            }
  }
  return {index, weight};
}

Qwen3VisionEncoderImpl::Qwen3VisionEncoderImpl(const VlmConfig& c, const torch::TensorOptions& opts)
    : cfg(c.vision) {
  const auto& v = cfg;
  side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(v.num_position_embeddings))));
  patch_embed = register_module(
      "patch_embed", PatchEmbed(v.embed_dim, v.in_chans, v.temporal_patch_size, v.patch_size, opts, /*bias=*/true));
  pos_embed = register_module("pos_embed", Embedding(v.num_position_embeddings, v.embed_dim, opts));
  blocks_list = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < v.depth; ++i) {
    blocks.push_back(Qwen3VisionBlock(v, opts));
    blocks_list->push_back(blocks.back());
  }
  merger = register_module("merger", Qwen3Merger(v, /*postshuffle_norm=*/false, opts));
  deepstack_list = register_module("deepstack_merger_list", torch::nn::ModuleList());
  for (size_t k = 0; k < v.deepstack_visual_indexes.size(); ++k) {
    deepstack_mergers.push_back(Qwen3Merger(v, /*postshuffle_norm=*/true, opts));
    deepstack_list->push_back(deepstack_mergers.back());
  }
}

int64_t Qwen3VisionEncoderImpl::deepstack_slot(int64_t block) const {
  const auto& ix = cfg.deepstack_visual_indexes;
  auto it = std::find(ix.begin(), ix.end(), block);
  return it == ix.end() ? -1 : static_cast<int64_t>(it - ix.begin());
}

void Qwen3VisionEncoderImpl::append_units(std::vector<Unit>& u, const std::string& prefix) {
  u.push_back({prefix + ".patch_embed", patch_embed.get(), ""});
  u.push_back({prefix + ".pos_embed", pos_embed.get(), ""});
  for (int64_t i = 0; i < static_cast<int64_t>(blocks.size()); ++i) {
    u.push_back({prefix + ".blocks." + std::to_string(i), blocks[size_t(i)].get(), ""});
    const int64_t k = deepstack_slot(i);
    if (k >= 0)
      u.push_back({prefix + ".deepstack_merger_list." + std::to_string(k), deepstack_mergers[size_t(k)].get(), ""});
  }
  u.push_back({prefix + ".merger", merger.get(), ""});
}

std::vector<VisionUnitLayout> Qwen3VisionEncoderImpl::unit_layouts(const std::string& prefix) {
  using Kind = VisionUnitLayout::Kind;
  std::vector<VisionUnitLayout> u(2);
  u[0].kind = Kind::patch_embed;
  u[0].path = prefix + ".patch_embed";
  u[1].kind = Kind::table_add;  // x + the resampled position table
  u[1].path = prefix + ".pos_embed";
  u[1].input = 0;
  auto merger_layout = [&](const std::string& path, const Qwen3Merger& m, int input) {
    VisionUnitLayout l;
    l.kind = Kind::merger;
    l.path = path;
    l.input = input;
    l.norm = m->norm->kind;
    l.postshuffle_norm = m->postshuffle;
    l.norm_name = "norm";
    l.fc1_name = "linear_fc1";
    l.fc2_name = "linear_fc2";
    return l;
  };
  int prev = 1;
  for (int64_t i = 0; i < static_cast<int64_t>(blocks.size()); ++i) {
    VisionUnitLayout b;
    b.kind = Kind::block;
    b.path = prefix + ".blocks." + std::to_string(i);
    b.input = prev;
    b.norm = blocks[size_t(i)]->norm1->kind;
    b.mlp = blocks[size_t(i)]->mlp->kind;
    u.push_back(b);
    prev = static_cast<int>(u.size()) - 1;
    const int64_t k = deepstack_slot(i);
    if (k >= 0)
      u.push_back(merger_layout(prefix + ".deepstack_merger_list." + std::to_string(k), deepstack_mergers[size_t(k)], prev));
  }
  u.push_back(merger_layout(prefix + ".merger", merger, prev));
  return u;
}

int64_t Qwen3VisionEncoderImpl::connector_parameters() {
  int64_t n = 0;
  for (const auto& p : merger->parameters()) n += p.numel();
  for (const auto& p : deepstack_list->parameters()) n += p.numel();
  return n;
}

VisionOutput Qwen3VisionEncoderImpl::encode(const torch::Tensor& pixel_values, const torch::Tensor& grid_thw,
                                            UnitRunner& runner, const std::string& prefix, SequenceExchange* sp) {
  const auto& v = cfg;
  auto g = grid_thw.to(torch::kCPU, torch::kInt64);
  const int64_t s = image_cu_seqlens(g).back();  // patches, summed on the host (no ATen op)
  VLM_CHECK(pixel_values.dim() == 2 && pixel_values.size(0) == s, "pixel_values has ", pixel_values.size(0),
            " rows but image_grid_thw ", g.sizes(), " sums to ", s, " patches (hint: rows = sum of t*gh*gw over images)");
  const VisionSplit split = vision_split(sp, s, v.merge_unit(), v.num_heads);
  // The unit keeps only this rank's rows: the whole output is transient.
  auto x = runner.run(prefix + ".patch_embed", *patch_embed, pixel_values,
                      [pe = patch_embed, split](const torch::Tensor& p) mutable { return split.rows(pe(p)); });  // [S or Sr, E]
  // Learned positions: sum over the 4 bilinear taps (weights fp32, as HF), cast to x's dtype.
  // Split: this rank's rows' taps (padding rows: tap 0 with weight 0).
  auto taps = qwen3_position_taps(g, side, v.spatial_merge_size);
  auto tap_index = stage_to_device(split.rows(taps.index), x.device());
  auto tap_weight = stage_to_device(split.rows(taps.weight), x.device()).unsqueeze(-1);
  x = runner.run(prefix + ".pos_embed", *pos_embed, x,
                 [pe = pos_embed, tap_index, tap_weight](const torch::Tensor& h) mutable {
                   return h + (pe(tap_index) * tap_weight).sum(1).to(h.scalar_type());
                 });
  auto cs = vision_rotary(g, v.head_dim(), v.spatial_merge_size, x.device(), v.rope_theta);
  const auto cos = split.rows(cs.cos), sin = split.rows(cs.sin);
  const auto cu = split.segments(image_cu_seqlens(g));
  VisionOutput out;
  for (int64_t i = 0; i < v.depth; ++i) {
    Qwen3VisionBlock& blk = blocks[size_t(i)];
    x = runner.run(prefix + ".blocks." + std::to_string(i), *blk, x,
                   [blk, cos, sin, cu, sp = split.sp](const torch::Tensor& h) mutable { return blk(h, cos, sin, cu, sp); });
    const int64_t k = deepstack_slot(i);
    if (k >= 0) {
      Qwen3Merger& m = deepstack_mergers[size_t(k)];
      auto d = runner.run(prefix + ".deepstack_merger_list." + std::to_string(k), *m, x,
                          [m](const torch::Tensor& h) mutable { return m(h); });  // [M or Sr / U, O]
      out.deepstack.push_back(split.gather(d, "vision deepstack features"));
    }
  }
  out.features = runner.run(prefix + ".merger", *merger, x,
                            [mg = merger](const torch::Tensor& h) mutable { return mg(h); });  // [M or Sr / U, O]
  out.features = split.gather(out.features, "vision merger features");                      // [M, O]
  return out;
}

}  // namespace vlm
