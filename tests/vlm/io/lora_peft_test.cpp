// LoRA adapters against PEFT 0.21 (peft.tuners.lora) on a tiny random Qwen2-VL, with references
// produced at test time by scripts/peft_reference.py in the build's Python environment (.venv:
// torch, transformers, peft, safetensors; a missing one fails every test, naming the fix).
//
// LoraPeftRead: adapters PEFT made (get_peft_model with init_lora_weights=False, so lora_B is
// random and non-zero, on the text decoder's q/k/v/o of every layer and the vision qkv;
// variants plain, rslora with rank_pattern / alpha_pattern keys (a suffix and a regex), and the
// rslora adapter under transformers 4's module names) are read with read_peft_adapter and
// applied with apply_peft_adapter onto the base loaded as vlmtrain loads any checkpoint. Per
// module, r / alpha / scaling equal what PEFT resolved; on two batches with images the logits,
// the summed loss and the gradient of every adapter weight match PEFT's.
// LoraPeftWrite: adapters vlmtrain made (add_lora with different r / alpha / rslora / init on
// some modules, the vision tower and merger included, lora_B made non-zero) are written with
// write_peft_adapter; PEFT loads the directory (PeftModel.from_pretrained; the script fails
// unless every tensor loads unchanged) onto the same base, puts adapters on exactly those
// modules with the same r and scaling, and its logits, loss and adapter gradients match
// vlmtrain's. Write -> read -> apply gives identical tensors; a rewrite keeps the directory's
// other files and leaves no temp directory; merged forward == unmerged forward.
// LoraPeftFiles: a corrupt or missing adapter_config.json and a truncated
// adapter_model.safetensors are errors naming the file (no Python needed).
//
// Tolerance: fp32 on both sides (HF eager attention). Relative error = max |diff| / max |reference|
// over real positions (logits), |diff| / |reference| (loss_sum), per tensor (gradients); all
// <= 1e-5, and merged vs unmerged logits <= 1e-5. Measured worst (printed as [lora_peft] lines):
// logits 2.5e-6, loss 1.0e-7, adapter gradients 6.5e-6 (reading PEFT's adapters); 1.0e-6, 2.0e-7,
// 3.4e-6 (PEFT loading vlmtrain's); merged vs unmerged 1.1e-6. The same order as HfParity's fp32
// differences, which these inherit.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>

#include "tests/testing.h"
#include "vlm/runtime/check.h"
#include "vlm/model/config.h"
#include "vlm/io/hf_checkpoint.h"
#include "vlm/model/lora.h"
#include "vlm/model/meta_init.h"
#include "vlm/io/peft_adapter.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/io/safetensors.h"

namespace {

constexpr double kLpTol = 1e-5;  // relative, fp32 (see the file comment)
// Qwen3.5 in fp32: its Gated DeltaNet's backward amplifies rounding; the bounds of its HF
// parity (hf_parity_test.cpp kHfpTolQ35F32: logits 1e-4, gradients 5e-4). Measured here:
// logits 1.9e-5, adapter gradients 1.2e-4.
struct LpTol {
  double logits = kLpTol, loss = kLpTol, grad = kLpTol;
};
constexpr LpTol kLpTolQ35{1e-4, 1e-5, 5e-4};

// ---------------------------------------------------------------- reference

struct LpReference {
  std::unique_ptr<vlm::test::TempDir> dir;
  std::string error;          // why there is none
  nlohmann::json manifest;    // manifest.json of `make`
};

std::string lp_script() { return vlm::test::source_dir() + "/scripts/peft_reference.py"; }

// `peft_reference.py make`, once per process.
LpReference& lp_reference() {
  static LpReference ref = [] {
    LpReference r;
    try {
      const std::string python = vlm::test::python_tool("python");
      r.dir = std::make_unique<vlm::test::TempDir>("peft_reference");
      auto run = vlm::test::run({python, lp_script(), "make", "--out", r.dir->path()}, std::chrono::seconds(600));
      if (run.exit_code != 0) {
        r.error = python + " " + lp_script() + " make failed (exit " + std::to_string(run.exit_code) +
                  "; hint: the build's Python environment needs torch, transformers, peft and safetensors: "
                  "scripts/install-deps.sh installs scripts/requirements.txt):\n" + run.output;
      } else {
        r.manifest = nlohmann::json::parse(vlm::test::read_file(*r.dir / "manifest.json"));
      }
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    return r;
  }();
  return ref;
}

// ---------------------------------------------------------------- vlmtrain side

// The base model of the reference, loaded as vlmtrain loads a checkpoint; eval mode (LoRA
// dropout off, as PEFT's model in eval()).
// variant: the adapter's; Qwen3.5's (qwen3_5_*) sit on their own base.
vlm::VisionLanguageModel lp_base(const LpReference& ref, const std::string& variant = "") {
  const std::string base = *ref.dir / (variant.rfind("qwen3_5", 0) == 0 ? "base_qwen3_5" : "base");
  vlm::VisionLanguageModel m(vlm::load_hf_config(base + "/config.json"), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 0, 0.02, /*init=*/false});
  vlm::load_module_weights(*m, base);
  m->eval();
  return m;
}

// As PEFT: only the adapters train.
void lp_freeze_base(torch::nn::Module& m) {
  for (auto& p : m.named_parameters()) p.value().set_requires_grad(vlm::is_lora_param(p.key()));
}

vlm::Batch lp_batch(const vlm::SafetensorsFile& io) {
  vlm::Batch b;
  b.input_ids = io.get("input_ids").clone();
  b.attention_mask = io.get("attention_mask").clone();
  b.labels = io.get("labels").clone();
  b.pixel_values = io.get("pixel_values").clone();
  b.image_grid_thw = io.get("image_grid_thw").clone();
  return b;
}

struct LpResult {
  torch::Tensor logits;                        // [B, L, V] fp32
  double loss_sum = 0;
  std::map<std::string, torch::Tensor> grads;  // PEFT tensor name -> d loss_sum / d weight
};

// vlmtrain's logits (forward with logits), summed loss and adapter gradients (training forward).
LpResult lp_run(vlm::VisionLanguageModel& m, const vlm::Batch& b) {
  LpResult r;
  {
    torch::NoGradGuard ng;
    r.logits = m->forward(b, /*return_logits=*/true).logits;
  }
  for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
  auto out = m->forward(b, /*return_logits=*/false);
  r.loss_sum = out.loss_sum.item<double>();
  out.loss_sum.backward();
  for (auto& [path, lin] : vlm::lora_modules(*m)) {
    r.grads[vlm::peft_tensor_name(path + ".lora_A.weight")] = lin->lora_A->weight.grad();
    r.grads[vlm::peft_tensor_name(path + ".lora_B.weight")] = lin->lora_B->weight.grad();
  }
  return r;
}

// A reference result from safetensors files: logits / loss_sum from `out`, gradients from
// `grads` under `prefix` + PEFT name.
LpResult lp_reference_result(const vlm::SafetensorsFile& out, const vlm::SafetensorsFile& grads,
                             const std::string& prefix) {
  LpResult r;
  r.logits = out.get("logits").clone();
  r.loss_sum = out.get("loss_sum").item<double>();
  for (const auto& n : grads.names())
    if (n.rfind(prefix, 0) == 0) r.grads[n.substr(prefix.size())] = grads.get(n).clone();
  return r;
}

struct LpWorst {
  double logits = 0, loss = 0, grad = 0;
  std::string grad_name;
};

LpWorst lp_compare(const LpResult& got, const LpResult& want, const torch::Tensor& mask, const LpTol& tol = {}) {
  LpWorst w;
  EXPECT_EQ(got.logits.sizes(), want.logits.sizes());
  if (got.logits.sizes() != want.logits.sizes()) return w;
  const auto real = mask.to(torch::kBool).unsqueeze(-1).expand_as(want.logits);
  const double scale = want.logits.masked_select(real).abs().max().item<double>();
  w.logits = (got.logits - want.logits).masked_select(real).abs().max().item<double>() / scale;
  EXPECT_LE(w.logits, tol.logits) << "max |logit diff| / max |logit| (max |logit| " << scale << ")";
  w.loss = std::abs(got.loss_sum - want.loss_sum) / std::abs(want.loss_sum);
  EXPECT_LE(w.loss, tol.loss) << "loss_sum " << got.loss_sum << " vs PEFT " << want.loss_sum;
  std::set<std::string> got_names, want_names;
  for (const auto& [n, _] : got.grads) got_names.insert(n);
  for (const auto& [n, _] : want.grads) want_names.insert(n);
  EXPECT_EQ(got_names, want_names) << "adapter tensors with a gradient: vlmtrain vs PEFT";
  EXPECT_FALSE(want_names.empty());
  for (const auto& [n, g] : want.grads) {
    auto it = got.grads.find(n);
    if (it == got.grads.end()) continue;
    const double gs = g.abs().max().item<double>();
    if (!it->second.defined() || it->second.sizes() != g.sizes() || gs == 0) {
      ADD_FAILURE() << n << ": vlmtrain's gradient " << (it->second.defined() ? "" : "is missing")
                    << " (PEFT's: " << g.sizes() << ", max " << gs << "; a zero one means the batch misses it)";
      continue;
    }
    const double rel = (it->second - g).abs().max().item<double>() / gs;
    EXPECT_LE(rel, tol.grad) << n << ": max |grad diff| / max |PEFT grad| (" << gs << ")";
    if (rel > w.grad) {
      w.grad = rel;
      w.grad_name = n;
    }
  }
  return w;
}

// Adapters as vlmtrain makes them: the decoder's attention (r 4, alpha 8, dropout 0.05), one of
// them with r 6 / alpha 3, one MLP projection (r 3, alpha 4, gaussian init), the vision qkv
// (r 2, alpha 5, rslora: the minority setting) and the merger's first Linear (alpha 16); lora_B
// random so the adapters matter.
void lp_add_adapters(vlm::VisionLanguageModelImpl& m, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& [path, lin] : vlm::linear_modules(m)) {
    vlm::LoraOptions o;
    o.r = 4;
    o.alpha = 8;
    const bool attn = path.find(".self_attn.") != std::string::npos;
    if (attn) o.dropout = 0.05;
    if (path == "model.layers.1.self_attn.v_proj") {
      o.r = 6;
      o.alpha = 3;
    } else if (path == "model.layers.0.mlp.gate_proj") {
      o.r = 3;
      o.alpha = 4;
      o.init = vlm::LoraInit::gaussian;
    } else if (path.rfind("visual.blocks.", 0) == 0 && path.size() > 9 && path.substr(path.size() - 9) == ".attn.qkv") {
      o.r = 2;
      o.alpha = 5;
      o.rslora = true;
    } else if (path == "visual.merger.mlp.0") {
      o.alpha = 16;
    } else if (!attn) {
      continue;
    }
    vlm::add_lora(*lin, o, seed, path);
    torch::NoGradGuard ng;
    lin->lora_B->weight.copy_(torch::randn(lin->lora_B->weight.sizes(), gen) * 0.05);
  }
}

// ---------------------------------------------------------------- LoraPeftRead

using LpCase = std::tuple<std::string, std::string>;  // adapter variant, batch

class LoraPeftRead : public ::testing::TestWithParam<LpCase> {};

INSTANTIATE_TEST_SUITE_P(
    Peft, LoraPeftRead,
    ::testing::Combine(::testing::Values("plain", "rslora", "rslora_legacy"),
                       ::testing::Values("images_left", "multi_image_right")),
    [](const ::testing::TestParamInfo<LpCase>& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param);
    });

// Qwen3.5: PEFT's adapter on the full layers' attention and the Gated DeltaNet projections
// (in_proj_qkv, in_proj_z, in_proj_a, out_proj) read into vlmtrain.
INSTANTIATE_TEST_SUITE_P(
    PeftQwen35, LoraPeftRead,
    ::testing::Combine(::testing::Values("qwen3_5_plain"), ::testing::Values("images_left", "multi_image_right")),
    [](const ::testing::TestParamInfo<LpCase>& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param);
    });

TEST_P(LoraPeftRead, LogitsLossAndAdapterGradientsMatchPeft) {
  const auto& ref = lp_reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const auto& [variant, batch] = GetParam();
  const bool legacy = variant == "rslora_legacy";
  const std::string ref_variant = legacy ? "rslora" : variant;  // same adapter, other names

  const vlm::PeftAdapter adapter = vlm::read_peft_adapter(*ref.dir / variant);
  const auto& resolved = ref.manifest.at("modules").at(ref_variant);  // what PEFT resolved
  ASSERT_EQ(adapter.modules.size(), resolved.size());
  for (const auto& a : adapter.modules) {
    const std::string nested = vlm::styled_hf_name(a.module, vlm::HfNameStyle::kNested);
    ASSERT_TRUE(resolved.contains(nested)) << nested << " has an adapter in the file but not in PEFT's model";
    const auto& p = resolved.at(nested);
    EXPECT_EQ(a.options.r, p.at("r").get<int64_t>()) << nested;
    EXPECT_EQ(a.options.alpha, p.at("alpha").get<double>()) << nested;
    EXPECT_NEAR(a.options.scaling(), p.at("scaling").get<double>(), 1e-12 * p.at("scaling").get<double>()) << nested;
    EXPECT_EQ(a.peft_module, legacy ? vlm::styled_hf_name(a.module, vlm::HfNameStyle::kLegacy) : nested);
  }

  auto m = lp_base(ref, variant);
  vlm::apply_peft_adapter(*m, adapter);
  EXPECT_EQ(vlm::lora_modules(*m).size(), adapter.modules.size());
  lp_freeze_base(*m);
  const std::string stem = *ref.dir / (ref_variant + "." + batch);
  const auto io = vlm::SafetensorsFile::open(stem + ".io.safetensors");
  const auto b = lp_batch(io);
  const auto w = lp_compare(lp_run(m, b), lp_reference_result(io, vlm::SafetensorsFile::open(stem + ".grads.safetensors"), ""),
                            b.attention_mask, variant.rfind("qwen3_5", 0) == 0 ? kLpTolQ35 : LpTol{});
  std::cout << "[lora_peft] read " << variant << "." << batch << ": logits " << w.logits << ", loss " << w.loss
            << ", worst adapter grad " << w.grad << " (" << w.grad_name << "), " << adapter.modules.size()
            << " modules\n";
}

// ---------------------------------------------------------------- LoraPeftWrite

TEST(LoraPeftWrite, PeftLoadsTheAdapterToTheSameLogitsAndGradients) {
  const auto& ref = lp_reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  auto m = lp_base(ref);
  lp_add_adapters(*m, 77);
  vlm::test::TempDir dir("lora_peft_write");
  const std::string adapter_dir = dir / "adapter";
  vlm::write_peft_adapter(*m, adapter_dir, "tiny-qwen2-vl");

  const std::string io_path = *ref.dir / "plain.multi_image_right.io.safetensors";
  const std::string python = vlm::test::python_tool("python");
  auto run = vlm::test::run({python, lp_script(), "load", "--base", *ref.dir / "base", "--adapter", adapter_dir, "--io",
                           io_path, "--out", dir / "peft.safetensors"},
                          std::chrono::seconds(300));
  ASSERT_EQ(run.exit_code, 0) << "PEFT could not load the adapter vlmtrain wrote:\n"
                              << run.output << "\nadapter_config.json:\n"
                              << vlm::test::read_file(adapter_dir + "/adapter_config.json");

  // PEFT put an adapter on exactly vlmtrain's modules, with the same rank and scaling.
  const auto resolved = vlm::test::last_json_line(run.output).at("modules");
  const auto mods = vlm::lora_modules(*m);
  EXPECT_EQ(resolved.size(), mods.size());
  for (const auto& [path, lin] : mods) {
    const std::string nested = vlm::styled_hf_name(path, vlm::HfNameStyle::kNested);
    ASSERT_TRUE(resolved.contains(nested)) << nested << ": PEFT did not adapt it";
    EXPECT_EQ(resolved.at(nested).at("r").get<int64_t>(), lin->lora_options.r) << nested;
    const double s = resolved.at(nested).at("scaling").get<double>();
    EXPECT_NEAR(s, lin->lora_scaling, 1e-12 * lin->lora_scaling) << nested << " (vlmtrain rslora "
                                                                  << lin->lora_options.rslora << ")";
  }

  lp_freeze_base(*m);
  const auto io = vlm::SafetensorsFile::open(io_path);
  const auto b = lp_batch(io);
  const auto out = vlm::SafetensorsFile::open(dir / "peft.safetensors");
  const auto w = lp_compare(lp_run(m, b), lp_reference_result(out, out, "grad."), b.attention_mask);
  std::cout << "[lora_peft] write: logits " << w.logits << ", loss " << w.loss << ", worst adapter grad " << w.grad
            << " (" << w.grad_name << "), " << mods.size() << " modules\n";
}

TEST(LoraPeftWrite, ReadBackGivesIdenticalTensorsAndRewriteIsAtomic) {
  const auto& ref = lp_reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  auto m = lp_base(ref);
  lp_add_adapters(*m, 78);
  vlm::test::TempDir dir("lora_peft_roundtrip");
  const std::string adapter_dir = dir / "adapter";
  vlm::write_peft_adapter(*m, adapter_dir, "");

  auto check_round_trip = [&](vlm::VisionLanguageModelImpl& src) {
    const auto adapter = vlm::read_peft_adapter(adapter_dir);
    auto back = lp_base(ref);
    vlm::apply_peft_adapter(*back, adapter);
    const auto a = vlm::lora_modules(src), b = vlm::lora_modules(*back);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const auto& [path, x] = a[i];
      const auto& [path_b, y] = b[i];
      ASSERT_EQ(path, path_b);
      EXPECT_TRUE(torch::equal(x->lora_A->weight, y->lora_A->weight)) << path;
      EXPECT_TRUE(torch::equal(x->lora_B->weight, y->lora_B->weight)) << path;
      EXPECT_EQ(x->lora_options.r, y->lora_options.r) << path;
      EXPECT_NEAR(x->lora_scaling, y->lora_scaling, 1e-12 * x->lora_scaling) << path;
      // PEFT has one use_rslora: the minority (the vision qkv) comes back as an alpha with the
      // same scaling; everything else keeps its alpha. One lora_dropout and one init too: the
      // most common values (0.05: 8 attention projections of 12 modules; kaiming).
      if (!x->lora_options.rslora) {
        EXPECT_EQ(x->lora_options.alpha, y->lora_options.alpha) << path;
      }
      EXPECT_FALSE(y->lora_options.rslora) << path;
      EXPECT_EQ(y->lora_options.dropout, 0.05) << path;
      EXPECT_EQ(y->lora_options.init, vlm::LoraInit::kaiming) << path;
    }
  };
  check_round_trip(*m);

  // A rewrite replaces the adapter, keeps the directory's other files, leaves nothing beside it.
  vlm::test::write_file(adapter_dir + "/README.md", "model card\n");
  {
    torch::NoGradGuard ng;
    for (auto& [path, lin] : vlm::lora_modules(*m)) lin->lora_B->weight.mul_(-2);
  }
  vlm::write_peft_adapter(*m, adapter_dir, "");
  check_round_trip(*m);
  EXPECT_EQ(vlm::test::read_file(adapter_dir + "/README.md"), "model card\n");
  std::set<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) entries.insert(e.path().filename().string());
  EXPECT_EQ(entries, (std::set<std::string>{"adapter"}));
  std::set<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(adapter_dir)) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"README.md", "adapter_config.json", "adapter_model.safetensors"}));
}

TEST(LoraPeftWrite, MergedForwardEqualsUnmerged) {
  const auto& ref = lp_reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  for (const std::string source : {"peft", "vlmtrain"}) {
    auto m = lp_base(ref);
    if (source == "peft") {
      vlm::apply_peft_adapter(*m, vlm::read_peft_adapter(*ref.dir / "rslora"));
    } else {
      lp_add_adapters(*m, 79);
    }
    const auto io = vlm::SafetensorsFile::open(*ref.dir / "plain.images_left.io.safetensors");
    const auto b = lp_batch(io);
    torch::NoGradGuard ng;
    const auto unmerged = m->forward(b, true).logits;
    const int64_t n = static_cast<int64_t>(vlm::lora_modules(*m).size());
    EXPECT_EQ(vlm::merge_all_lora(*m), n);
    EXPECT_TRUE(vlm::lora_modules(*m).empty());
    const auto merged = m->forward(b, true).logits;
    const double rel = (merged - unmerged).abs().max().item<double>() / unmerged.abs().max().item<double>();
    EXPECT_LE(rel, kLpTol) << source;
    // And the adapters mattered: without them the logits differ by far more.
    auto plain = lp_base(ref);
    const double off = (plain->forward(b, true).logits - unmerged).abs().max().item<double>() /
                       unmerged.abs().max().item<double>();
    EXPECT_GT(off, 1e3 * kLpTol) << source;
    std::cout << "[lora_peft] merge " << source << ": merged vs unmerged logits " << rel << " (" << n
              << " modules; without adapters " << off << ")\n";
  }
}

// ---------------------------------------------------------------- LoraPeftFiles

// An adapter directory written by vlmtrain from the tiny preset (no Python needed).
std::string lp_write_tiny_adapter(const vlm::test::TempDir& dir) {
  vlm::VisionLanguageModel m(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, torch::kFloat32, 3});
  for (auto& [path, lin] : vlm::linear_modules(*m))
    if (path.find("q_proj") != std::string::npos) vlm::add_lora(*lin, vlm::LoraOptions{}, 1, path);
  const std::string out = dir / "adapter";
  vlm::write_peft_adapter(*m, out, "tiny");
  return out;
}

// The vlm::Error message of read_peft_adapter(dir) ("" when it succeeds).
std::string lp_read_error(const std::string& dir) {
  try {
    vlm::read_peft_adapter(dir);
  } catch (const vlm::Error& e) {
    return e.what();
  }
  return "";
}

TEST(LoraPeftFiles, CorruptOrMissingConfigNamesTheFile) {
  vlm::test::TempDir dir("lora_peft_files");
  const std::string a = lp_write_tiny_adapter(dir);
  EXPECT_EQ(lp_read_error(a), "");
  const std::string cfg = a + "/adapter_config.json";
  const std::string good = vlm::test::read_file(cfg);
  vlm::test::write_file(cfg, good.substr(0, good.size() / 2));  // cut mid-way
  std::string err = lp_read_error(a);
  EXPECT_NE(err.find(cfg), std::string::npos) << err;
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
  vlm::test::write_file(cfg, "[1, 2]");
  err = lp_read_error(a);
  EXPECT_NE(err.find(cfg), std::string::npos) << err;
  std::filesystem::remove(cfg);
  err = lp_read_error(a);
  EXPECT_NE(err.find(cfg), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
}

TEST(LoraPeftFiles, TruncatedOrMissingWeightsNameTheFile) {
  vlm::test::TempDir dir("lora_peft_files");
  const std::string a = lp_write_tiny_adapter(dir);
  const std::string st = a + "/adapter_model.safetensors";
  const std::string bytes = vlm::test::read_file(st);
  for (size_t keep : {bytes.size() - 1, bytes.size() / 2, size_t(12), size_t(3)}) {
    vlm::test::write_file(st, bytes.substr(0, keep));
    const std::string err = lp_read_error(a);
    EXPECT_NE(err.find(st), std::string::npos) << "kept " << keep << " bytes: " << err;
  }
  std::filesystem::remove(st);
  std::string err = lp_read_error(a);
  EXPECT_NE(err.find(st), std::string::npos) << err;
  vlm::test::write_file(a + "/adapter_model.bin", "pickle");
  err = lp_read_error(a);
  EXPECT_NE(err.find("adapter_model.bin"), std::string::npos) << err;
  EXPECT_NE(lp_read_error(dir / "nowhere").find("nowhere"), std::string::npos);
}

}  // namespace
