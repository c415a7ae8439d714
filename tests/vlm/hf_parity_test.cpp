// Parity with the HuggingFace reference implementation.
// Goldens come from scripts/make_goldens.py (transformers, fp32, eager attention), run on a
// machine that has transformers; see tests/golden/README.md. For each family the test
// builds the model from the golden config.json, loads the golden weights by HF name, runs
// the golden batch and compares logits (real positions) within 1e-4 relative to the
// largest reference logit, and the summed loss within 1e-4 relative.
// Without goldens the test is skipped with a message; with goldens that disagree it fails.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "tests/testing.h"
#include "vlm/config.h"
#include "vlm/meta_init.h"
#include "vlm/qwen2_vl.h"

namespace {

std::string golden_dir() {
  const char* env = std::getenv("VLMTRAIN_GOLDEN_DIR");
  return env ? std::string(env) : vlmtest::source_dir() + "/tests/golden";
}

// Minimal safetensors reader for the goldens (F32 and I64 only; the project's own reader
// lives in vlm/safetensors.h and is tested separately).
std::map<std::string, torch::Tensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto j = nlohmann::json::parse(header);
  std::map<std::string, torch::Tensor> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto dt = it.value()["dtype"].get<std::string>();
    EXPECT_TRUE(dt == "F32" || dt == "I64") << it.key() << " has dtype " << dt;
    const auto shape = it.value()["shape"].get<std::vector<int64_t>>();
    const auto off = it.value()["data_offsets"].get<std::vector<size_t>>();
    auto t = torch::empty(shape, dt == "F32" ? torch::kFloat32 : torch::kInt64);
    EXPECT_EQ(off[1] - off[0], t.numel() * t.element_size()) << it.key();
    std::memcpy(t.data_ptr(), data.data() + off[0], off[1] - off[0]);
    out[it.key()] = t;
  }
  return out;
}

// Builds the model from <base>.config.json, loads <base>.weights.safetensors, runs the
// batch of <base>.io.safetensors and compares logits and loss.
void check_against(const std::string& base, const std::string& name) {
  const auto cfg = vlm::load_hf_config(base + ".config.json");
  vlm::Qwen2VL m(cfg, torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 0, 0.02, /*init=*/false});
  auto w = read_safetensors(base + ".weights.safetensors");
  auto params = m->named_parameters();
  {
    torch::NoGradGuard ng;
    for (auto& p : params) {
      auto it = w.find(p.key());
      ASSERT_NE(it, w.end()) << "golden weights lack " << p.key();
      ASSERT_EQ(it->second.sizes(), p.value().sizes()) << p.key();
      p.value().copy_(it->second);
    }
  }
  EXPECT_EQ(static_cast<size_t>(params.size()), w.size()) << "golden has weights the model does not";

  auto io = read_safetensors(base + ".io.safetensors");
  vlm::Batch b;
  b.input_ids = io["input_ids"];
  b.attention_mask = io["attention_mask"];
  b.labels = io["labels"];
  b.pixel_values = io["pixel_values"];
  b.image_grid_thw = io["image_grid_thw"];
  torch::NoGradGuard ng;
  auto out = m->forward(b, true);
  const auto& ref = io["logits"];
  ASSERT_EQ(out.logits.sizes(), ref.sizes());
  auto real = b.attention_mask.to(torch::kBool).unsqueeze(-1);  // padding rows are not compared
  const double scale = ref.abs().max().item<double>();
  const double diff = (out.logits - ref).abs().masked_select(real).max().item<double>();
  std::cout << name << ": max |logit diff| " << diff << " (max |logit| " << scale << ")\n";
  EXPECT_LE(diff, 1e-4 * scale + 1e-6);
  EXPECT_EQ(out.n_tokens, io["n_tokens"].item<int64_t>());
  const double lref = io["loss_sum"].item<double>();
  EXPECT_NEAR(out.loss_sum.item<double>(), lref, 1e-4 * std::abs(lref));
}

class HfParity : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Goldens, HfParity, ::testing::Values("qwen2_vl_small", "qwen2_5_vl_small"));

TEST_P(HfParity, LogitsAndLossMatchTransformers) {
  const std::string base = golden_dir() + "/" + GetParam();
  if (!vlmtest::file_exists(base + ".io.safetensors")) {
    GTEST_SKIP() << "no goldens at " << base << ".*: run scripts/make_goldens.py where "
                 << "transformers is installed (tests/golden/README.md)";
  }
  check_against(base, GetParam());
}

// The same comparison against scripts/spec_reference.py: a second implementation of the
// forward in plain PyTorch written from the spec (per-token loops, dense masks instead of
// window permutations), run with the build's Python environment (fails if it is missing).
TEST(SpecReference, LogitsAndLossMatchPlainPytorchReference) {
  const std::string python = vlmtest::python_tool("python");
  vlmtest::TempDir dir("spec_ref");
  auto r = vlmtest::run({python, vlmtest::source_dir() + "/scripts/spec_reference.py", "--out", dir.path()},
                        std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* name : {"qwen2_vl_small", "qwen2_5_vl_small"}) {
    SCOPED_TRACE(name);
    check_against(dir / name, name);
  }
}

}  // namespace
