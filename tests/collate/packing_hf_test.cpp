// Positions of a packed row (issue #27) against HF transformers: every sample's segment of
// position_ids equals Qwen2VLModel / Qwen2_5_VLModel / Qwen3VLModel.get_rope_index of that
// sample alone (scripts/rope_index_reference.py with the .venv's transformers; a missing
// interpreter or transformers fails the test). Exact integer equality.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <random>

#include "collate/micro_batch.h"
#include "tests/collate/synthetic.h"
#include "tests/testing.h"

using namespace vlm::collate;
using nlohmann::json;

namespace packing_hf_test {

// Samples with text before and after images, two images, adjacent text-only samples, an
// image right at a sample start and one closing a sample.
std::vector<vlm::TokenizedSample> layout_samples(const vlm::VlmConfig& cfg) {
  std::mt19937_64 rng(9);
  std::vector<vlm::TokenizedSample> out;
  out.push_back(vlm::test::synthetic_sample(cfg, rng, 0, 7, {{1, 4, 6}}, 3));
  out.push_back(vlm::test::synthetic_sample(cfg, rng, 1, 5, {}, 2));
  out.push_back(vlm::test::synthetic_sample(cfg, rng, 2, 3, {}, 1));
  out.push_back(vlm::test::synthetic_sample(cfg, rng, 3, 9, {{1, 2, 2}, {1, 6, 4}}, 4));
  out.push_back(vlm::test::synthetic_sample(cfg, rng, 4, 0, {{1, 4, 4}}, 1));   // image only
  out.push_back(vlm::test::synthetic_sample(cfg, rng, 5, 1, {{1, 8, 2}}, 1));   // image near the start
  out.push_back(vlm::test::synthetic_sample(cfg, rng, 6, 12, {}, 6));
  return out;
}

json sample_case(const std::string& family, const vlm::TokenizedSample& s) {
  json grids = json::array();
  for (const auto& g : s.grid_thw) grids.push_back({g[0], g[1], g[2]});
  return {{"family", family},
          {"input_ids", {s.input_ids}},
          {"attention_mask", {std::vector<int64_t>(s.input_ids.size(), 1)}},
          {"image_grid_thw", grids}};
}

TEST(PackedRopeHf, SegmentsEqualGetRopeIndexOfEachSampleAlone) {
  const std::string python = vlm::test::python_tool("python");  // throws, with a hint, if missing
  struct Family {
    std::string name, preset;
  };
  const std::vector<Family> families = {
      {"qwen2_vl", "qwen2-vl-2b"}, {"qwen2_5_vl", "qwen2.5-vl-3b"}, {"qwen3_vl", "qwen3-vl-2b"}};
  json cases = json::array();
  std::vector<MicroBatch> packed;
  std::vector<std::vector<vlm::TokenizedSample>> samples;
  for (const auto& f : families) {
    const vlm::VlmConfig cfg = vlm::preset(f.preset);
    samples.push_back(layout_samples(cfg));
    packed.push_back(build_packed_micro_batch(samples.back(), cfg));
    for (const auto& s : samples.back()) cases.push_back(sample_case(f.name, s));
  }
  vlm::test::TempDir dir("packed_rope_hf");
  vlm::test::write_file(dir / "cases.json", cases.dump());
  auto r = vlm::test::run({python, vlm::test::source_dir() + "/scripts/rope_index_reference.py", "--cases",
                         dir / "cases.json", "--out", dir / "out.jsonl"},
                        std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << "scripts/rope_index_reference.py failed (" << python << "):\n" << r.output;
  std::ifstream in(dir / "out.jsonl");
  int64_t compared = 0;
  for (size_t f = 0; f < families.size(); ++f) {
    const auto& pos = packed[f].batch.position_ids;  // [3, 1, L]
    const auto cu = packed[f].batch.text_cu_seqlens;
    for (size_t i = 0; i < samples[f].size(); ++i) {
      SCOPED_TRACE(families[f].name + " sample " + std::to_string(i));
      std::string line;
      ASSERT_TRUE(static_cast<bool>(std::getline(in, line)));
      const json ref = json::parse(line);
      const int64_t start = cu[static_cast<int64_t>(i)].item<int64_t>();
      const int64_t n = static_cast<int64_t>(samples[f][i].input_ids.size());
      ASSERT_EQ(cu[static_cast<int64_t>(i) + 1].item<int64_t>() - start, n);
      for (int c = 0; c < 3; ++c)
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(pos[c][0][start + j].item<int64_t>(), ref["position_ids"][c][0][j].get<int64_t>())
              << "stream " << c << " token " << j;
          ++compared;
        }
    }
  }
  std::cout << "packed rows: " << compared << " position ids equal to HF get_rope_index of each sample alone ("
            << cases.size() << " samples, 3 families)\n";
}

}  // namespace packing_hf_test
