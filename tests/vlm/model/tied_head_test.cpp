// A config with tie_word_embeddings whose checkpoint also (or only) holds lm_head.weight,
// against transformers at test time: scripts/tied_head_reference.py writes three variants
// of a tiny tied Qwen2-VL (lm_head.weight equal to the embedding, different from it, or in
// its place), loads each with Qwen2VLForConditionalGeneration.from_pretrained and records
// its logits on one text batch and whether HF kept the head tied. vlmtrain loads each with
// load_hf_config + resolve_tied_head + load_module_weights and must agree on tying and give
// the same logits: max |diff| / max |HF logit| <= 1e-5 (fp32 on both sides; the model
// parity tests measure <= 2.4e-6 on such models).
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/io/safetensors.h"

namespace tied_head_test {

TEST(TiedHead, LoadsAsTransformersDoes) {
  const std::string python = vlm::test::python_tool("python");  // throws, with a hint, if missing
  vlm::test::TempDir dir("tied_head");
  auto r = vlm::test::run({python, vlm::test::source_dir() + "/scripts/tied_head_reference.py", "--out", dir.path()},
                        std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << "scripts/tied_head_reference.py failed (" << python << "):\n" << r.output;
  for (const char* variant : {"head_equal", "head_differs", "head_only"}) {
    SCOPED_TRACE(variant);
    const std::string d = dir / variant;
    auto cfg = vlm::load_hf_config(d);
    ASSERT_TRUE(cfg.tie_word_embeddings);
    const auto ckpt = vlm::HfCheckpoint::open(d);
    // Without the resolution a tied config rejects (or misses) the head tensor.
    {
      vlm::VisionLanguageModel plain(cfg, torch::TensorOptions().device(torch::kMeta));
      vlm::materialize(*plain, {torch::kCPU, torch::kFloat32, 0, 0.02, false});
      EXPECT_THROW(vlm::load_module_weights(*plain, ckpt), vlm::Error);
    }
    const auto tied = vlm::resolve_tied_head(cfg, ckpt);
    EXPECT_NE(tied.note.find("lm_head.weight"), std::string::npos) << tied.note;
    EXPECT_NE(tied.note.find(d), std::string::npos) << tied.note;
    std::cout << tied.note << "\n";
    vlm::VisionLanguageModel m(cfg, torch::TensorOptions().device(torch::kMeta));
    vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 0, 0.02, false});
    vlm::load_module_weights(*m, ckpt, tied.load);
    m->eval();
    auto io = vlm::SafetensorsFile::open(dir / (std::string(variant) + ".logits.safetensors"));
    const bool hf_tied = io.get("tied").item<int64_t>() == 1;
    EXPECT_EQ(cfg.tie_word_embeddings, hf_tied);
    EXPECT_EQ(static_cast<bool>(m->lm_head), !hf_tied);
    vlm::Batch b;
    b.input_ids = io.get("input_ids").clone();
    torch::NoGradGuard ng;
    const auto ours = m->forward(b, /*return_logits=*/true).logits.to(torch::kFloat32);
    const auto hf = io.get("logits").clone();
    ASSERT_EQ(ours.sizes(), hf.sizes());
    const double rel = (ours - hf).abs().max().item<double>() / hf.abs().max().item<double>();
    EXPECT_LE(rel, 1e-5) << "logits differ from HF's (relative to max |logit|)";
  }
}

}  // namespace tied_head_test
