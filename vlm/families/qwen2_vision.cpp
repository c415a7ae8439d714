#include "vlm/families/qwen2_vision.h"

#include <algorithm>

#include "vlm/runtime/check.h"
#include "vlm/model/rotary.h"
#include "vlm/model/recompute_tail.h"
#include "vlm/model/vision_split.h"
#include "vlm/runtime/device_staging.h"

namespace vlm {

Qwen2VisionBlockImpl::Qwen2VisionBlockImpl(const VlmConfig& cfg, const torch::TensorOptions& opts) {
  const auto& v = cfg.vision;
  norm1 = register_module("norm1", Norm(v.norm, v.embed_dim, v.norm_eps, opts));
  norm2 = register_module("norm2", Norm(v.norm, v.embed_dim, v.norm_eps, opts));
  attn = register_module("attn", VisionAttention(v.embed_dim, v.num_heads, opts));
  mlp = register_module("mlp", Mlp(v.mlp, v.embed_dim, v.intermediate_size, /*bias=*/true, opts));
}

torch::Tensor Qwen2VisionBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                       const torch::Tensor& sin, const std::vector<int64_t>& cu,
                                            SequenceExchange* sp) {
  auto h = x + attn(norm1(x), cos, sin, cu, sp);
  return residual_linear(this, h, mlp->hidden(norm2(h)), mlp->out_proj());
}

std::vector<int64_t> image_cu_seqlens(const torch::Tensor& grid_thw) {
  auto g = grid_thw.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* d = g.data_ptr<int64_t>();
  std::vector<int64_t> cu{0};
  for (int64_t i = 0; i < g.size(0); ++i)
    for (int64_t t = 0; t < d[3 * i]; ++t) cu.push_back(cu.back() + d[3 * i + 1] * d[3 * i + 2]);
  return cu;
}

WindowIndex get_window_index(const torch::Tensor& grid_thw, const VisionConfig& vc) {
  const int64_t merge = vc.spatial_merge_size;
  const int64_t w = vc.window_size / merge / vc.patch_size;  // window side in merged tokens
  VLM_CHECK(w > 0, "vision window_size ", vc.window_size, " is smaller than one merged token (",
            merge * vc.patch_size, " pixels)");
  auto g = grid_thw.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* d = g.data_ptr<int64_t>();
  std::vector<int64_t> index;
  std::vector<int64_t> cu{0};
  int64_t base = 0;
  for (int64_t i = 0; i < g.size(0); ++i) {
    const int64_t t = d[3 * i], hh = d[3 * i + 1] / merge, ww = d[3 * i + 2] / merge;
    const int64_t nwh = (hh + w - 1) / w, nww = (ww + w - 1) / w;
    for (int64_t tt = 0; tt < t; ++tt)
      for (int64_t wy = 0; wy < nwh; ++wy)
        for (int64_t wx = 0; wx < nww; ++wx) {
          int64_t count = 0;
          for (int64_t r = wy * w; r < std::min(hh, (wy + 1) * w); ++r)
            for (int64_t c = wx * w; c < std::min(ww, (wx + 1) * w); ++c) {
              index.push_back(base + (tt * hh + r) * ww + c);
              ++count;
            }
          if (count > 0) cu.push_back(cu.back() + count * merge * merge);
        }
    base += t * hh * ww;
  }
  auto idx = torch::from_blob(index.data(), {static_cast<int64_t>(index.size())}, torch::kInt64).clone();
  return {idx, cu};
}

Qwen2VisionEncoderImpl::Qwen2VisionEncoderImpl(const VlmConfig& c, const torch::TensorOptions& opts) : cfg(c) {
  const auto& v = cfg.vision;
  patch_embed = register_module("patch_embed",
                                PatchEmbed(v.embed_dim, v.in_chans, v.temporal_patch_size, v.patch_size, opts));
  blocks_list = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < v.depth; ++i) {
    blocks.push_back(Qwen2VisionBlock(cfg, opts));
    blocks_list->push_back(blocks.back());
  }
  merger = register_module("merger", PatchMerger(cfg, opts));
}

void Qwen2VisionEncoderImpl::append_units(std::vector<Unit>& u, const std::string& prefix) {
  u.push_back({prefix + ".patch_embed", patch_embed.get(), ""});
  for (size_t i = 0; i < blocks.size(); ++i) u.push_back({prefix + ".blocks." + std::to_string(i), blocks[i].get(), ""});
  u.push_back({prefix + ".merger", merger.get(), ""});
}

std::vector<VisionUnitLayout> Qwen2VisionEncoderImpl::unit_layouts(const std::string& prefix) {
  using Kind = VisionUnitLayout::Kind;
  std::vector<VisionUnitLayout> u(1);
  u[0].kind = Kind::patch_embed;
  u[0].path = prefix + ".patch_embed";
  for (size_t i = 0; i < blocks.size(); ++i) {
    VisionUnitLayout b;
    b.kind = Kind::block;
    b.path = prefix + ".blocks." + std::to_string(i);
    b.input = static_cast<int>(u.size()) - 1;
    b.norm = blocks[i]->norm1->kind;
    b.mlp = blocks[i]->mlp->kind;
    u.push_back(b);
  }
  VisionUnitLayout m;
  m.kind = Kind::merger;
  m.path = prefix + ".merger";
  m.input = static_cast<int>(u.size()) - 1;
  m.norm = merger->ln_q->kind;
  m.norm_name = "ln_q";
  m.fc1_name = "mlp.0";
  m.fc2_name = "mlp.2";
  u.push_back(m);
  return u;
}

int64_t Qwen2VisionEncoderImpl::connector_parameters() {
  int64_t n = 0;
  for (const auto& p : merger->parameters()) n += p.numel();
  return n;
}

torch::Tensor Qwen2VisionEncoderImpl::forward(const torch::Tensor& pixel_values, const torch::Tensor& grid_thw,
                                              UnitRunner& runner, const std::string& prefix, SequenceExchange* sp) {
  const auto& v = cfg.vision;
  const int64_t unit = v.merge_unit();
  auto g = grid_thw.to(torch::kCPU, torch::kInt64);
  const int64_t s = image_cu_seqlens(g).back();  // patches, summed on the host (no ATen op)
  VLM_CHECK(pixel_values.dim() == 2 && pixel_values.size(0) == s, "pixel_values has ", pixel_values.size(0),
            " rows but image_grid_thw ", g.sizes(), " sums to ", s, " patches (hint: rows = sum of t*gh*gw over images)");
  const VisionSplit split = vision_split(sp, s, unit, v.num_heads);
  const auto cu_full = image_cu_seqlens(g);
  std::vector<int64_t> cu_window = cu_full;
  // Qwen2.5 windows: the patches in window order (whole merge groups), host-computed, so that
  // each window (and each image) is contiguous; undone on the merged features at the end.
  torch::Tensor window, order;  // [M] merged tokens, [S] patch rows
  if (v.window_attention()) {
    auto wi = get_window_index(g, v);
    window = wi.index;
    cu_window = wi.cu_seqlens;
    order = (window.unsqueeze(1) * unit + torch::arange(unit, torch::kInt64)).reshape({-1});
  }
  // The unit keeps only its rows (window order, this rank's): the whole output is transient.
  auto x = runner.run(prefix + ".patch_embed", *patch_embed, pixel_values,
                      [pe = patch_embed, split, order](const torch::Tensor& p) mutable {
                        return split.rows(pe(p), order);
                      });  // [S or Sr, E]
  auto cs = vision_rotary(g, v.head_dim(), v.spatial_merge_size, x.device());
  const auto cos = split.rows(cs.cos, order), sin = split.rows(cs.sin, order);
  const auto seg_full = split.segments(cu_full), seg_window = split.segments(cu_window);
  const auto& full = v.fullatt_block_indexes;
  for (int64_t i = 0; i < v.depth; ++i) {
    const bool is_full = !v.window_attention() || std::find(full.begin(), full.end(), i) != full.end();
    const auto& cu = is_full ? seg_full : seg_window;
    Qwen2VisionBlock& blk = blocks[i];
    x = runner.run(prefix + ".blocks." + std::to_string(i), *blk, x,
                   [blk, cos, sin, cu, sp = split.sp](const torch::Tensor& h) mutable { return blk(h, cos, sin, cu, sp); });
  }
  auto out = runner.run(prefix + ".merger", *merger, x,
                        [mg = merger](const torch::Tensor& h) mutable { return mg(h); });  // [M or Sr / U, O]
  out = split.gather(out, "vision merger features");                                      // [M, O]
  if (window.defined()) out = out.index_select(0, stage_to_device(torch::argsort(window), out.device()));
  return out;
}

}  // namespace vlm
