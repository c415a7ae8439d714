// Position ids: M-RoPE (get_rope_index) on worked examples, vision rotary ids in
// merge-block order, Qwen2.5 window index, and the rotary cos/sin tables against the
// formulas of transformers' modeling_qwen2_vl.py (get_rope_index, VisionRotaryEmbedding,
// apply_multimodal_rotary_pos_emb).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "tests/testing.h"

#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/model/rope_index.h"
#include "vlm/model/rotary.h"
#include "vlm/families/qwen2_vision.h"

namespace {

using vlm::VlmConfig;

VlmConfig cfg2b() { return vlm::preset("qwen2-vl-2b"); }
constexpr int64_t kImg = 151655, kVs = 151652, kVe = 151653;

torch::Tensor ids_tensor(const std::vector<int64_t>& v) {
  return torch::tensor(v, torch::kInt64).view({1, -1});
}

TEST(RopeIndex, OneImageAfterPrefixSpecExample) {
  // 480x640 -> 476x644 -> grid (1, 34, 46): 17 x 23 = 391 merged tokens.
  const int64_t s = 5;  // prefix incl. <|vision_start|>
  std::vector<int64_t> ids{10, 11, 12, 13, kVs};
  for (int i = 0; i < 391; ++i) ids.push_back(kImg);
  ids.insert(ids.end(), {kVe, 20, 21});
  auto grid = torch::tensor({1, 34, 46}, torch::kInt64).view({1, 3});
  auto r = vlm::get_rope_index(ids_tensor(ids), grid, {}, cfg2b());
  auto p = r.position_ids;
  ASSERT_EQ(p.sizes(), torch::IntArrayRef({3, 1, static_cast<int64_t>(ids.size())}));
  for (int64_t j = 0; j < s; ++j)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(p[c][0][j].item<int64_t>(), j);
  for (int64_t k = 0; k < 391; ++k) {
    const int64_t row = k / 23, col = k % 23;
    EXPECT_EQ(p[0][0][s + k].item<int64_t>(), s);
    EXPECT_EQ(p[1][0][s + k].item<int64_t>(), s + row);
    EXPECT_EQ(p[2][0][s + k].item<int64_t>(), s + col);
  }
  for (int64_t j = 0; j < 3; ++j)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(p[c][0][s + 391 + j].item<int64_t>(), s + 23 + j);
  EXPECT_EQ(r.rope_deltas.item<int64_t>(), -368);
}

TEST(RopeIndex, TwoImagesWithTextBetween) {
  // image A grid (1,4,6) -> 2x3 tokens; image B grid (1,6,4) -> 3x2 tokens.
  std::vector<int64_t> ids{1, kVs, kImg, kImg, kImg, kImg, kImg, kImg, kVe, 7, kVs,
                           kImg, kImg, kImg, kImg, kImg, kImg, kVe, 9};
  auto grid = torch::tensor({1, 4, 6, 1, 6, 4}, torch::kInt64).view({2, 3});
  auto r = vlm::get_rope_index(ids_tensor(ids), grid, {}, cfg2b());
  // Hand-derived: text 0,1; image A at base 2: rows 0..1, cols 0..2 -> max 4;
  // vision_end 5, text 6, vision_start 7; image B at base 8: rows 0..2, cols 0..1 -> max 10;
  // vision_end 11, text 12.
  std::vector<int64_t> t{0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7, 8, 8, 8, 8, 8, 8, 11, 12};
  std::vector<int64_t> h{0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7, 8, 8, 9, 9, 10, 10, 11, 12};
  std::vector<int64_t> w{0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 9, 8, 9, 8, 9, 11, 12};
  auto p = r.position_ids;
  for (size_t j = 0; j < ids.size(); ++j) {
    EXPECT_EQ(p[0][0][j].item<int64_t>(), t[j]) << j;
    EXPECT_EQ(p[1][0][j].item<int64_t>(), h[j]) << j;
    EXPECT_EQ(p[2][0][j].item<int64_t>(), w[j]) << j;
  }
  EXPECT_EQ(r.rope_deltas.item<int64_t>(), 13 - 19);
}

TEST(RopeIndex, TextOnlyAndPadding) {
  // Row 0: 6 real tokens. Row 1: left padded (2 pads, 4 real). Row 2: right padded.
  auto ids = torch::tensor({5, 6, 7, 8, 9, 10, 0, 0, 5, 6, 7, 8, 5, 6, 7, 0, 0, 0}, torch::kInt64).view({3, 6});
  auto mask = torch::tensor({1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, torch::kInt64).view({3, 6});
  auto r = vlm::get_rope_index(ids, {}, mask, cfg2b());
  std::vector<std::vector<int64_t>> want{{0, 1, 2, 3, 4, 5}, {1, 1, 0, 1, 2, 3}, {0, 1, 2, 1, 1, 1}};
  for (int b = 0; b < 3; ++b)
    for (int j = 0; j < 6; ++j)
      for (int c = 0; c < 3; ++c) EXPECT_EQ(r.position_ids[c][b][j].item<int64_t>(), want[b][j]) << b << "," << j;
  EXPECT_EQ(r.rope_deltas[0][0].item<int64_t>(), 0);
  EXPECT_EQ(r.rope_deltas[1][0].item<int64_t>(), -2);
  EXPECT_EQ(r.rope_deltas[2][0].item<int64_t>(), -3);
}

TEST(RopeIndex, PaddedImageRowAndCountMismatch) {
  // Left-padded row with an image (grid 1,2,4 -> 1x2 tokens).
  auto ids = ids_tensor({0, 0, 3, kVs, kImg, kImg, kVe, 4});
  auto mask = torch::tensor({0, 0, 1, 1, 1, 1, 1, 1}, torch::kInt64).view({1, 8});
  auto grid = torch::tensor({1, 2, 4}, torch::kInt64).view({1, 3});
  auto r = vlm::get_rope_index(ids, grid, mask, cfg2b());
  std::vector<int64_t> w{1, 1, 0, 1, 2, 3, 4, 5};
  std::vector<int64_t> h{1, 1, 0, 1, 2, 2, 4, 5};
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(r.position_ids[2][0][j].item<int64_t>(), w[j]) << j;
    EXPECT_EQ(r.position_ids[1][0][j].item<int64_t>(), h[j]) << j;
  }
  EXPECT_EQ(r.rope_deltas.item<int64_t>(), 6 - 8);
  // 3 image tokens for a 2-token image and no second grid row: an error.
  auto bad = ids_tensor({3, kVs, kImg, kImg, kImg, kVe});
  EXPECT_THROW(vlm::get_rope_index(bad, grid, {}, cfg2b()), vlm::Error);
  // A grid row with no image tokens: an error.
  auto grid2 = torch::tensor({1, 2, 4, 1, 2, 4}, torch::kInt64).view({2, 3});
  EXPECT_THROW(vlm::get_rope_index(ids, grid2, mask, cfg2b()), vlm::Error);
}

TEST(VisionRotary, IdsInMergeBlockOrder) {
  // Two images: (1, 4, 6) and (2, 2, 2); spec: row r = (((t*(gh/2)+bh)*(gw/2)+bw)*2+mh)*2+mw
  // holds the patch at (2bh+mh, 2bw+mw).
  auto grid = torch::tensor({1, 4, 6, 2, 2, 2}, torch::kInt64).view({2, 3});
  auto ids = vlm::vision_rotary_pos_ids(grid, 2);
  ASSERT_EQ(ids.sizes(), torch::IntArrayRef({24 + 8, 2}));
  int64_t row = 0;
  for (auto [t, gh, gw] : std::vector<std::array<int64_t, 3>>{{1, 4, 6}, {2, 2, 2}})
    for (int64_t tt = 0; tt < t; ++tt)
      for (int64_t bh = 0; bh < gh / 2; ++bh)
        for (int64_t bw = 0; bw < gw / 2; ++bw)
          for (int64_t mh = 0; mh < 2; ++mh)
            for (int64_t mw = 0; mw < 2; ++mw, ++row) {
              EXPECT_EQ(ids[row][0].item<int64_t>(), 2 * bh + mh);
              EXPECT_EQ(ids[row][1].item<int64_t>(), 2 * bw + mw);
            }
  // First block of image 0: TL, TR, BL, BR.
  EXPECT_TRUE(torch::equal(ids.narrow(0, 0, 4), torch::tensor({0, 0, 0, 1, 1, 0, 1, 1}, torch::kInt64).view({4, 2})));
}

TEST(VisionRotary, CosSinMatchSpecFormula) {
  auto grid = torch::tensor({1, 4, 6}, torch::kInt64).view({1, 3});
  const int64_t hd = 80;
  auto cs = vlm::vision_rotary(grid, hd, 2, torch::kCPU);
  auto ids = vlm::vision_rotary_pos_ids(grid, 2);
  ASSERT_EQ(cs.cos.sizes(), torch::IntArrayRef({24, 80}));
  for (int64_t s = 0; s < 24; ++s)
    for (int64_t j = 0; j < hd; ++j) {
      const int64_t jj = j % 40;  // dims j and j+40 share the angle
      const int64_t k = jj % 20;
      const double pos = static_cast<double>(ids[s][jj < 20 ? 0 : 1].item<int64_t>());
      const double ang = pos * std::pow(10000.0, -2.0 * k / 40.0);
      EXPECT_NEAR(cs.cos[s][j].item<double>(), std::cos(ang), 2e-6);
      EXPECT_NEAR(cs.sin[s][j].item<double>(), std::sin(ang), 2e-6);
    }
}

TEST(Mrope, CosSinTakeEachFrequencyFromItsStream) {
  const int64_t hd = 128;
  auto pos = torch::randint(0, 500, {3, 2, 5}, torch::kInt64);
  auto cs = vlm::mrope_cos_sin(pos, hd, 1e6, {16, 24, 24}, torch::kFloat32);
  ASSERT_EQ(cs.cos.sizes(), torch::IntArrayRef({2, 5, 128}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t l = 0; l < 5; ++l)
      for (int64_t j = 0; j < hd; ++j) {
        const int64_t k = j % 64;
        const int stream = k < 16 ? 0 : (k < 40 ? 1 : 2);
        const double ang = static_cast<double>(pos[stream][b][l].item<int64_t>()) * std::pow(1e6, -2.0 * k / 128.0);
        // fp32 angles up to ~500 rad: allow the fp32 rounding of the angle.
        EXPECT_NEAR(cs.cos[b][l][j].item<double>(), std::cos(ang), 1e-4);
        EXPECT_NEAR(cs.sin[b][l][j].item<double>(), std::sin(ang), 1e-4);
      }
}

// Reference window index written the way transformers' get_window_index computes it: pad the merged grid to
// multiples of w with -1 (pad = w - H' mod w, a full extra row of windows when divisible),
// tile windows, read raster, drop padding; window lengths x merge^2, duplicates removed.
vlm::WindowIndex reference_windows(int64_t t, int64_t gh, int64_t gw, int64_t w) {
  const int64_t hh = gh / 2, ww = gw / 2;
  const int64_t ph = w - hh % w, pw = w - ww % w;
  auto idx = torch::arange(t * hh * ww, torch::kInt64).view({t, hh, ww});
  auto padded = torch::constant_pad_nd(idx, {0, pw, 0, ph}, -1);
  const int64_t nh = (hh + ph) / w, nw = (ww + pw) / w;
  padded = padded.view({t, nh, w, nw, w}).permute({0, 1, 3, 2, 4}).reshape({t, nh * nw, w * w});
  auto lens = (padded != -1).sum(2).reshape({-1});
  auto flat = padded.reshape({-1});
  auto index = flat.masked_select(flat != -1);
  std::vector<int64_t> cu{0};
  for (int64_t i = 0; i < lens.size(0); ++i) {
    const int64_t next = cu.back() + lens[i].item<int64_t>() * 4;
    if (next != cu.back()) cu.push_back(next);
  }
  return {index, cu};
}

TEST(WindowIndex, Qwen25For17x23HasThirtyWindows) {
  auto cfg = vlm::preset("qwen2.5-vl-3b");
  auto grid = torch::tensor({1, 34, 46}, torch::kInt64).view({1, 3});
  auto wi = vlm::get_window_index(grid, cfg.vision);
  EXPECT_EQ(wi.cu_seqlens.size(), 31u);  // 5 x 6 windows
  EXPECT_EQ(wi.cu_seqlens.back(), 391 * 4);
  EXPECT_EQ(wi.cu_seqlens[1], 16 * 4);  // full 4x4 window
  auto ref = reference_windows(1, 34, 46, 4);
  EXPECT_TRUE(torch::equal(wi.index, ref.index));
  EXPECT_EQ(wi.cu_seqlens, ref.cu_seqlens);
  // First window: merged rows 0..3, cols 0..3 in raster order.
  std::vector<int64_t> first;
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) first.push_back(r * 23 + c);
  EXPECT_TRUE(torch::equal(wi.index.narrow(0, 0, 16), torch::tensor(first, torch::kInt64)));
}

TEST(WindowIndex, MultipleImagesAndDivisibleSides) {
  auto cfg = vlm::preset("qwen2.5-vl-3b");
  // (1,16,16): 8x8 merged, divisible by 4 (the reference pads a full empty window row).
  // (2,6,10): two frames of 3x5.
  auto grid = torch::tensor({1, 16, 16, 2, 6, 10}, torch::kInt64).view({2, 3});
  auto wi = vlm::get_window_index(grid, cfg.vision);
  auto a = reference_windows(1, 16, 16, 4);
  auto b = reference_windows(2, 6, 10, 4);
  auto want = torch::cat({a.index, b.index + 64});
  EXPECT_TRUE(torch::equal(wi.index, want));
  std::vector<int64_t> cu = a.cu_seqlens;
  for (size_t i = 1; i < b.cu_seqlens.size(); ++i) cu.push_back(b.cu_seqlens[i] + a.cu_seqlens.back());
  EXPECT_EQ(wi.cu_seqlens, cu);
  EXPECT_EQ(wi.cu_seqlens.size(), 1u + 4u + 2u * 2u);
}

}  // namespace

// ---------------------------------------------------------------- HF get_rope_index
// Position ids against transformers' own get_rope_index (scripts/rope_index_reference.py,
// at test time, with mm_token_type_ids marked as HF's processor marks them) on layouts
// built here: several images per row, an image right after another (<|vision_end|>
// <|vision_start|> between them), an image opening the row and one closing it, non-square
// grids, a text-only row beside image rows, left padding; both families. Required: equal
// position ids on every real (unmasked) token, and the same decoding offset (HF's delta is
// relative to the real length, vlmtrain's to the padded length L: ours + L == HF + n_real).
// Then the cases where a run of pads alone would mislead: a pad that does not follow
// <|vision_start|>, too few pads, one pad too many: errors naming the sequence and position.
namespace rope_hf_test {

using nlohmann::json;

struct Row {
  std::vector<int64_t> ids;
  std::vector<std::array<int64_t, 3>> grids;
};

// Items: n > 0 = n text tokens, {t, h, w} via image().
struct RowBuilder {
  Row row;
  std::mt19937_64 rng{7};
  RowBuilder& text(int n) {
    for (int i = 0; i < n; ++i) row.ids.push_back(10 + int64_t(rng() % 5000));
    return *this;
  }
  RowBuilder& image(int64_t h, int64_t w) {
    row.ids.push_back(kVs);
    for (int64_t i = 0; i < h * w / 4; ++i) row.ids.push_back(kImg);
    row.ids.push_back(kVe);
    row.grids.push_back({1, h, w});
    return *this;
  }
};

json batch_json(const std::string& family, const std::vector<Row>& rows, torch::Tensor* ids,
                torch::Tensor* mask, torch::Tensor* grid) {
  size_t L = 0;
  for (const auto& r : rows) L = std::max(L, r.ids.size());
  const int64_t B = static_cast<int64_t>(rows.size());
  *ids = torch::full({B, int64_t(L)}, 151643, torch::kInt64);
  *mask = torch::zeros({B, int64_t(L)}, torch::kInt64);
  std::vector<int64_t> g;
  for (int64_t b = 0; b < B; ++b) {
    const size_t off = L - rows[b].ids.size();
    for (size_t j = 0; j < rows[b].ids.size(); ++j) {
      (*ids)[b][int64_t(off + j)] = rows[b].ids[j];
      (*mask)[b][int64_t(off + j)] = 1;
    }
    for (const auto& gr : rows[b].grids) g.insert(g.end(), gr.begin(), gr.end());
  }
  *grid = torch::tensor(g, torch::kInt64).view({-1, 3});
  auto to_list = [](const torch::Tensor& t) {
    json out = json::array();
    for (int64_t b = 0; b < t.size(0); ++b) {
      json row = json::array();
      for (int64_t j = 0; j < t.size(1); ++j) row.push_back(t[b][j].item<int64_t>());
      out.push_back(row);
    }
    return out;
  };
  json grids = json::array();
  for (size_t i = 0; i < g.size(); i += 3) grids.push_back({g[i], g[i + 1], g[i + 2]});
  return {{"family", family}, {"input_ids", to_list(*ids)}, {"attention_mask", to_list(*mask)},
          {"image_grid_thw", grids}};
}

TEST(RopeIndexHf, EqualsTransformersGetRopeIndex) {
  const std::string python = vlm::test::python_tool("python");  // throws, with a hint, if missing
  std::vector<std::vector<Row>> layouts;
  layouts.push_back({RowBuilder().text(3).image(4, 6).text(2).image(2, 2).text(4).row,
                     RowBuilder().image(6, 4).text(5).row, RowBuilder().text(9).row});
  layouts.push_back({RowBuilder().text(2).image(2, 4).image(4, 4).text(1).row,  // adjacent images
                     RowBuilder().text(4).image(10, 14).row});                   // image closes the row
  layouts.push_back({RowBuilder().image(8, 2).row, RowBuilder().text(1).image(2, 2).text(30).row});
  struct Case {
    std::string family;
    vlm::VlmConfig cfg;
    torch::Tensor ids, mask, grid;
  };
  std::vector<Case> cases;
  json js = json::array();
  for (const auto& [family, preset] : {std::pair<std::string, std::string>{"qwen2_vl", "qwen2-vl-2b"},
                                       {"qwen2_5_vl", "qwen2.5-vl-3b"}}) {
    for (const auto& rows : layouts) {
      Case c{family, vlm::preset(preset), {}, {}, {}};
      js.push_back(batch_json(family, rows, &c.ids, &c.mask, &c.grid));
      cases.push_back(c);
    }
  }
  vlm::test::TempDir dir("rope_hf");
  vlm::test::write_file(dir / "cases.json", js.dump());
  auto r = vlm::test::run({python, vlm::test::source_dir() + "/scripts/rope_index_reference.py", "--cases",
                         dir / "cases.json", "--out", dir / "out.jsonl"},
                        std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << "scripts/rope_index_reference.py failed (" << python << "):\n" << r.output;
  std::ifstream in(dir / "out.jsonl");
  int64_t compared = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE(cases[k].family + " layout " + std::to_string(k % layouts.size()));
    std::string line;
    ASSERT_TRUE(static_cast<bool>(std::getline(in, line)));
    const json ref = json::parse(line);
    const auto ours = vlm::get_rope_index(cases[k].ids, cases[k].grid, cases[k].mask, cases[k].cfg);
    const int64_t B = cases[k].ids.size(0), L = cases[k].ids.size(1);
    for (int64_t b = 0; b < B; ++b) {
      int64_t n_real = 0;
      for (int64_t j = 0; j < L; ++j) {
        if (cases[k].mask[b][j].item<int64_t>() == 0) continue;
        ++n_real;
        for (int c = 0; c < 3; ++c) {
          ASSERT_EQ(ours.position_ids[c][b][j].item<int64_t>(), ref["position_ids"][c][b][j].get<int64_t>())
              << "stream " << c << " row " << b << " col " << j;
          ++compared;
        }
      }
      EXPECT_EQ(ours.rope_deltas[b][0].item<int64_t>() + L, ref["rope_deltas"][b].get<int64_t>() + n_real)
          << "row " << b;
    }
  }
  std::cout << "rope index: " << compared << " position ids equal to HF get_rope_index over "
            << cases.size() << " batches\n";
}

void expect_rope_error(const std::vector<int64_t>& ids, const std::vector<int64_t>& grid,
                       const std::string& needle) {
  try {
    vlm::get_rope_index(ids_tensor(ids), torch::tensor(grid, torch::kInt64).view({-1, 3}), {}, cfg2b());
    ADD_FAILURE() << "expected an error containing " << needle;
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(RopeIndexHf, ImagesStartAtVisionStartNotAtAnyPad) {
  // A pad typed in the text before a real image: no vision_start before it.
  expect_rope_error({3, kImg, 4, kVs, kImg, kImg, kVe}, {1, 2, 4}, "position 1");
  // Too few pads after vision_start for the grid.
  expect_rope_error({3, kVs, kImg, kVe, 4}, {1, 2, 4}, "needs 2 image tokens");
  // One pad too many: the third pad follows the block, not a vision_start.
  expect_rope_error({3, kVs, kImg, kImg, kImg, kVe}, {1, 2, 4}, "position 4");
  // Two images' pads run together with only one vision_start.
  expect_rope_error({kVs, kImg, kImg, kImg, kImg, kVe}, {1, 2, 4, 1, 2, 4}, "position 3");
}

}  // namespace rope_hf_test
