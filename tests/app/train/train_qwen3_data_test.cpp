// TrainQwen3Data: `vlmtrain train` with a Qwen3-VL model (preset tiny-qwen3) feeds the model
// Qwen3-VL inputs end to end: the micro-batches the trainer dumps (VLMTRAIN_DUMP_BATCHES)
// hold pixel_values [P, 1536] (3 x 2 x 16 x 16) normalised with mean/std 0.5, grids on
// the 32-px resize grid with at least 64 merged tokens (min_pixels 65536), one image pad per
// merged token, and rows that start with the user turn (no default system turn). The same
// data under preset tiny (Qwen2-VL) gives [P, 1176] and a system turn: the difference is
// the model's, not the recipe's. `vlmtrain eval` with tiny-qwen3 scores every sample.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "tests/app/train/train_testing.h"
#include "tests/require_sentencepiece.h"
#include "tests/testing.h"
#include "vlm/io/safetensors.h"
#include "vlm/text/tokenizer.h"

namespace {

struct DumpFacts {
  int64_t patch_dim = 0;        // pixel_values columns
  int64_t images = 0;
  int64_t min_tokens = 1 << 30; // fewest merged tokens of an image
  bool grids_on_32 = true;      // every grid side even (patch 16 x merge 2 = 32 px)
  bool pads_match = true;       // <|image_pad|> count == sum t*h*w/4
  bool system_turn = false;     // any row whose first turn is "system"
  bool user_first = true;       // every row's first turn is "user"
  double min_pixel = 0, max_pixel = 0;
};

DumpFacts read_dump(const std::string& dump_dir, const vlm::Tokenizer& tok) {
  DumpFacts f;
  const int64_t pad = tok.special_id("<|image_pad|>"), im_start = tok.special_id("<|im_start|>");
  for (const auto& e : std::filesystem::directory_iterator(dump_dir)) {
    const auto st = vlm::SafetensorsFile::open(e.path().string());
    if (!st.contains("pixel_values")) continue;
    const torch::Tensor pv = st.get("pixel_values"), thw = st.get("image_grid_thw");
    const torch::Tensor ids = st.get("input_ids"), mask = st.get("attention_mask");
    f.patch_dim = pv.size(1);
    f.min_pixel = std::min(f.min_pixel, pv.min().item<double>());
    f.max_pixel = std::max(f.max_pixel, pv.max().item<double>());
    int64_t tokens = 0;
    for (int64_t i = 0; i < thw.size(0); ++i) {
      const int64_t t = thw[i][0].item<int64_t>(), h = thw[i][1].item<int64_t>(), w = thw[i][2].item<int64_t>();
      f.grids_on_32 = f.grids_on_32 && h % 2 == 0 && w % 2 == 0;
      f.min_tokens = std::min(f.min_tokens, t * h * w / 4);
      tokens += t * h * w / 4;
      ++f.images;
    }
    f.pads_match = f.pads_match && (ids == pad).sum().item<int64_t>() == tokens;
    for (int64_t r = 0; r < ids.size(0); ++r) {
      std::vector<int64_t> row;
      for (int64_t k = 0; k < ids.size(1); ++k)
        if (mask[r][k].item<int64_t>() != 0) row.push_back(ids[r][k].item<int64_t>());
      for (size_t k = 0; k + 1 < row.size(); ++k)
        if (row[k] == im_start) {  // the first turn of the row: its role's text
          // Up to 6 pieces: the synthetic tokenizer may spell "system" a character a piece.
          const std::vector<int64_t> role(row.begin() + int64_t(k) + 1,
                                          row.begin() + int64_t(std::min(row.size(), k + 7)));
          const std::string text = tok.decode(role);
          f.system_turn = f.system_turn || text.rfind("system", 0) == 0;
          f.user_first = f.user_first && text.rfind("user", 0) == 0;
          break;
        }
    }
  }
  return f;
}

TEST(TrainQwen3Data, TrainerFeedsQwen3InputsEndToEnd) {
  VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE();
  vlm::test::TempDir dir("train_qwen3_data");
  const std::string synth = dir / "synth";
  vlm::test::make_synth_data(synth, 6, 11);
  auto tok = vlm::load_tokenizer(synth + "/tokenizer.model");

  auto train = [&](const std::string& preset, const std::string& name) {
    std::vector<std::string> a = vlm::test::tiny_train_args(dir / name, synth, 2, 0);
    a.insert(a.end(), {"--set", "model.preset=" + preset, "--set", "data.system_prompt=\"\""});
    auto r = vlm::test::run(a, std::chrono::seconds(300), {"VLMTRAIN_DUMP_BATCHES=" + (dir / (name + "_batches"))});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return read_dump(dir / (name + "_batches"), *tok);
  };
  const DumpFacts q3 = train("tiny-qwen3", "q3");
  ASSERT_GT(q3.images, 0);
  EXPECT_EQ(q3.patch_dim, 3 * 2 * 16 * 16);
  EXPECT_TRUE(q3.grids_on_32);
  EXPECT_GE(q3.min_tokens, 64);  // every line image scaled up to min_pixels 65536
  EXPECT_TRUE(q3.pads_match);
  EXPECT_FALSE(q3.system_turn);
  EXPECT_TRUE(q3.user_first);
  // (v / 255 - 0.5) / 0.5 spans [-1, 1]; CLIP's normalisation would reach beyond it.
  EXPECT_GE(q3.min_pixel, -1.0);
  EXPECT_LE(q3.max_pixel, 1.0);

  // `vlmtrain eval` builds its prompts with the same processor: no sample is skipped (a
  // pad / grid disagreement would skip it).
  const std::string eval_out = dir / "q3_eval";
  auto e = vlm::test::run({vlm::test::vlmtrain_bin(), "eval", vlm::test::source_dir() + "/recipes/ocr_tiny.toml",
                         "--set", "model.preset=tiny-qwen3", "--set", "model.tokenizer=" + synth + "/tokenizer.model",
                         "--set", "data.system_prompt=\"\"", "--set", "data.num_workers=1", "--data",
                         synth + "/val.jsonl", "--max-new-tokens", "3", "--out", eval_out},
                        std::chrono::seconds(300));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const auto summary = nlohmann::json::parse(vlm::test::read_file(eval_out + "/eval_summary.json"));
  EXPECT_EQ(summary["samples"], 4);
  EXPECT_EQ(summary["overall"]["skipped"], 0) << summary.dump();

  const DumpFacts q2 = train("tiny", "q2");
  ASSERT_GT(q2.images, 0);
  EXPECT_EQ(q2.patch_dim, 3 * 2 * 14 * 14);
  EXPECT_TRUE(q2.pads_match);
  EXPECT_TRUE(q2.system_turn);
  EXPECT_FALSE(q2.user_first);
  // CLIP's normalisation reaches beyond [-1, 1] (black: -1.79 .. -1.48, white: 1.93 .. 2.15).
  EXPECT_TRUE(q2.min_pixel < -1.0 || q2.max_pixel > 1.0) << q2.min_pixel << " " << q2.max_pixel;
}

}  // namespace
