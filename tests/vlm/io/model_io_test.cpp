// The real tiny models through HF directories (issue #3): save in both prefix styles and
// as a sharded index, load into a freshly initialised model, get identical tensors and
// identical logits; config.json round-trips; missing tensors and wrong shapes are named.
#include <gtest/gtest.h>

#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"

namespace {

vlm::VisionLanguageModel make_io_model(const std::string& preset, uint64_t seed) {
  vlm::VisionLanguageModel model(vlm::preset(preset), torch::TensorOptions().device(torch::kMeta));
  vlm::MaterializeOptions opts;
  opts.seed = seed;
  vlm::materialize(*model, opts);
  return model;
}

vlm::Batch sample_batch(const vlm::VlmConfig& cfg) {
  vlm::Batch b;
  std::vector<int64_t> ids = {11, 12, cfg.vision_start_token_id};
  for (int i = 0; i < 6; ++i) ids.push_back(cfg.image_token_id);  // grid 1x4x6 -> 6 merged
  ids.insert(ids.end(), {cfg.vision_end_token_id, 40, 41, 42});
  b.input_ids = torch::tensor(ids, torch::kLong).view({1, -1});
  b.labels = b.input_ids.clone();
  b.pixel_values = torch::randn({24, 1176}, torch::TensorOptions().dtype(torch::kFloat));
  b.image_grid_thw = torch::tensor({1, 4, 6}, torch::kLong).view({1, 3});
  return b;
}

void expect_same_state(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& p : pa) {
    ASSERT_TRUE(pb.contains(p.key())) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  }
}

TEST(ModelIo, BothFamiliesBothStylesAndShardedRoundTrip) {
  for (const std::string preset : {"tiny", "tiny-qwen2.5"}) {
    auto src = make_io_model(preset, 1);
    int n = 0;
    for (auto style : {vlm::HfNameStyle::kLegacy, vlm::HfNameStyle::kNested}) {
      for (uint64_t shard : {uint64_t(5'000'000'000ULL), uint64_t(400'000)}) {
        SCOPED_TRACE(preset + " case " + std::to_string(n));
        vlm::test::TempDir dir("model_io");
        std::string out = dir / ("ckpt" + std::to_string(n++));
        vlm::SaveHfOptions opts;
        opts.dtype = torch::kFloat;  // exact round trip
        opts.style = style;
        opts.max_shard_bytes = shard;
        opts.extra_files = {{"config.json", vlm::to_hf_json(src->cfg).dump(2)}};
        auto report = vlm::save_hf_checkpoint(out, vlm::module_state(*src), opts);
        if (shard < 1'000'000) EXPECT_GT(report.files.size(), 3u) << "expected several shards";
        EXPECT_TRUE(vlm::test::file_exists(out + "/config.json"));
        if (src->cfg.tie_word_embeddings) EXPECT_EQ(report.tied_skipped, 0);  // lm_head owns nothing

        // A model built from the saved config, initialised differently, then loaded.
        auto cfg = vlm::load_hf_config(out);
        EXPECT_EQ(vlm::to_hf_json(cfg), vlm::to_hf_json(src->cfg));
        vlm::VisionLanguageModel dst(cfg, torch::TensorOptions().device(torch::kMeta));
        vlm::MaterializeOptions mo;
        mo.seed = 99;
        vlm::materialize(*dst, mo);
        auto load = vlm::load_module_weights(*dst, out);
        EXPECT_EQ(load.loaded, static_cast<int64_t>(src->named_parameters().size()));
        expect_same_state(*src, *dst);

        torch::NoGradGuard no_grad;
        auto batch = sample_batch(src->cfg);
        auto a = src->forward(batch, true), b = dst->forward(batch, true);
        EXPECT_TRUE(torch::equal(a.logits, b.logits));
        EXPECT_EQ(a.loss_sum.item<float>(), b.loss_sum.item<float>());
      }
    }
  }
}

TEST(ModelIo, Bf16CheckpointLoadsWithinBf16Rounding) {
  auto src = make_io_model("tiny", 2);
  vlm::test::TempDir dir("model_io_bf16");
  vlm::save_hf_checkpoint(dir / "ckpt", vlm::module_state(*src), {});  // default: bf16
  auto dst = make_io_model("tiny", 3);
  vlm::load_module_weights(*dst, dir / "ckpt");
  for (const auto& p : src->named_parameters()) {
    auto expected = p.value().to(torch::kBFloat16).to(torch::kFloat);
    EXPECT_TRUE(torch::equal(dst->named_parameters()[p.key()], expected)) << p.key();
  }
}

TEST(ModelIo, MissingTensorAndWrongShapeAreNamed) {
  auto src = make_io_model("tiny", 4);
  vlm::test::TempDir dir("model_io_err");
  auto state = vlm::module_state(*src);
  // Drop one tensor.
  vlm::NamedTensors missing;
  for (const auto& [name, t] : state)
    if (name != "model.layers.1.mlp.up_proj.weight") missing.emplace_back(name, t);
  vlm::save_hf_checkpoint(dir / "missing", missing, {});
  auto dst = make_io_model("tiny", 5);
  try {
    vlm::load_module_weights(*dst, dir / "missing");
    FAIL() << "load succeeded without model.layers.1.mlp.up_proj.weight";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e.what();
  }
  // Wrong shape: a checkpoint of a wider model.
  vlm::NamedTensors wrong;
  for (const auto& [name, t] : state)
    wrong.emplace_back(name, name == "visual.merger.mlp.0.weight" ? torch::zeros({7, 3}) : t);
  vlm::save_hf_checkpoint(dir / "wrong", wrong, {});
  try {
    vlm::load_module_weights(*dst, dir / "wrong");
    FAIL() << "load accepted a [7, 3] merger weight";
  } catch (const vlm::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("visual.merger.mlp.0.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[7, 3]"), std::string::npos) << msg;
  }
}

}  // namespace
