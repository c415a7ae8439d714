// The activation plan (app/plan/activation_memory.h) against the storages the model's forward
// really leaves alive, counted by the tensor memory meter (vlm/runtime/tensor_memory.h): per unit
// (the bytes a unit's forward adds, its output included) and in total (the forward's end,
// and the peak through backward), for every family in fp32 and bf16, fully trained, with a
// frozen vision tower, with LoRA on a frozen LLM (with and without dropout), packed and
// without images. The reference is the allocator's count, independent of the plan's
// arithmetic. Tolerances: per unit exact (the plan counts whole storages); forward total
// 1% (small index and mask tensors outside the units are not modelled); backward peak 5%
// (the plan bounds the head's transients, the measured peak also holds parameter .grad).
// Context parallelism (Ulysses, cp 2 and 4): rank 0's chunk, with a stand-in exchange that
// returns a copy of what it is given: the real one's shapes and allocations (one new tensor
// per exchange), other values, which memory does not depend on. Per unit exact but for
// model.embed_tokens, whose output is the whole micro-batch's embeddings until the chunk is
// copied out of it (the plan counts the copy, which is what the forward keeps). The backward
// peak is held as what the split saves: measured peak at cp 1 minus at cp against the plan's,
// 1% (both peaks come in the loss head's backward and hold the same parameter gradients,
// which the plan leaves to the step's model; the absolute 5% of cp 1 would be loose or tight
// depending on how small the chunk's activations are next to them).
#include <gtest/gtest.h>

#include <cstdio>

#include "app/plan/activation_memory.h"
#include "vlm/model/config.h"
#include "vlm/model/lora.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/runtime/tensor_memory.h"

namespace {

using vlm::TensorMemoryMeter;

// Records the bytes each unit's forward leaves alive (its output included).
struct MeterRunner : vlm::UnitRunner {
  std::vector<std::pair<std::string, int64_t>> added;
  torch::Tensor run(const std::string& path, torch::nn::Module&, const torch::Tensor& x,
                    const std::function<torch::Tensor(const torch::Tensor&)>& fn) override {
    const int64_t before = TensorMemoryMeter::live_bytes();
    auto y = fn(x);
    added.emplace_back(path, TensorMemoryMeter::live_bytes() - before);
    return y;
  }
};

// A one-process stand-in for a cp group's exchange (rank 0): a copy of x, as the all-to-all's
// output (and a ring hop's) is a new tensor of x's shape.
struct CopyExchange : vlm::SequenceExchange {
  CopyExchange(int64_t cp, vlm::SequenceMode mode) : cp_(cp), mode_(mode) {}
  int64_t size() const override { return cp_; }
  int64_t rank() const override { return 0; }
  vlm::SequenceMode mode() const override { return mode_; }
  torch::Tensor all_to_all(const torch::Tensor& x, const std::string&) override { return x.clone(); }
  torch::Tensor ring_pass(const torch::Tensor& x, const std::string&) override { return x.clone(); }
  int64_t cp_;
  vlm::SequenceMode mode_;
};

// rows x len tokens, right padded (the last 5 tokens of each row padding); one image per
// row of grid (1, gh, gw) (none when gh == 0); half of the rest supervised. packed: the rows
// back to back in one row, each its own sample.
vlm::Batch make_batch(const vlm::VlmConfig& c, int64_t rows, int64_t len, int64_t gh, int64_t gw, torch::Dtype dt,
                      bool packed) {
  const int64_t n_img = gh * gw / c.vision.merge_unit();
  vlm::Batch b;
  b.input_ids = torch::full({rows, len}, int64_t{5}, torch::kInt64);
  b.labels = torch::full({rows, len}, int64_t{-100}, torch::kInt64);
  b.attention_mask = torch::ones({rows, len}, torch::kInt64);
  for (int64_t r = 0; r < rows; ++r) {
    if (n_img > 0) {
      b.input_ids[r][1] = c.vision_start_token_id;
      for (int64_t i = 0; i < n_img; ++i) b.input_ids[r][2 + i] = c.image_token_id;
      b.input_ids[r][2 + n_img] = c.vision_end_token_id;
    }
    for (int64_t t = 3 + n_img + (len - 8 - n_img) / 2; t < len - 5; ++t) b.labels[r][t] = 7 + t % 11;
    if (!packed) b.attention_mask[r].narrow(0, len - 5, 5).zero_();
  }
  if (packed) {
    b.input_ids = b.input_ids.reshape({1, rows * len});
    b.labels = b.labels.reshape({1, rows * len});
    b.attention_mask = torch::ones({1, rows * len}, torch::kInt64);
    b.text_cu_seqlens = torch::arange(0, rows * len + 1, len, torch::kInt64);
    for (int64_t r = 0; r < rows; ++r) b.labels[0][r * len] = -100;  // no target across samples
  }
  b.right_padded = true;
  if (n_img > 0) {
    b.pixel_values = torch::randn({rows * gh * gw, c.vision.patch_dim()}).to(dt);
    b.image_grid_thw = torch::tensor({int64_t{1}, gh, gw}, torch::kInt64).view({1, 3}).repeat({rows, 1});
  }
  return b;
}

enum class Mix { trained, frozen_vision, lora_qv, lora_all_dropout };

const char* mix_name(Mix m) {
  switch (m) {
    case Mix::trained: return "trained";
    case Mix::frozen_vision: return "frozen vision";
    case Mix::lora_qv: return "lora q,v";
    default: return "lora all + dropout";
  }
}

void apply_mix(vlm::VisionLanguageModelImpl& m, Mix mix) {
  if (mix == Mix::trained) return;
  if (mix == Mix::frozen_vision) {
    for (auto& p : m.named_parameters())
      if (p.key().rfind("visual.merger", 0) != 0 && p.key().rfind("visual.", 0) == 0) p.value().set_requires_grad(false);
    return;
  }
  vlm::LoraOptions o;
  o.r = 4;
  o.dropout = mix == Mix::lora_all_dropout ? 0.1 : 0.0;
  for (auto& [path, lin] : vlm::linear_modules(*m.model)) {
    const std::string full = "model." + path;
    const bool qv = full.find("q_proj") != std::string::npos || full.find("v_proj") != std::string::npos;
    if (mix == Mix::lora_qv && !qv) continue;
    vlm::add_lora(*lin, o, 7, full);
  }
  for (auto& p : m.named_parameters()) p.value().set_requires_grad(vlm::is_lora_param(p.key()));
}

struct Case {
  std::string preset;
  torch::Dtype dtype;
  Mix mix;
  int64_t gh = 8, gw = 16;  // 0: text only
  bool packed = false;
  int64_t cp = 1;  // context parallelism: rank 0 of a stand-in group of cp
  int64_t len = 96;
  bool absolute_peak = true;  // hold the backward peak to 5% (check_saving holds the saving instead)
  vlm::SequenceMode cp_mode = vlm::SequenceMode::kUlysses;  // of the stand-in group
};

struct Measured {
  double peak = 0, planned_peak = 0;
};

void check(const Case& k, Measured* measured = nullptr) {
  SCOPED_TRACE(k.preset + " " + c10::toString(k.dtype) + " " + mix_name(k.mix) + (k.packed ? " packed" : "") +
               (k.gh == 0 ? " text only" : "") + (k.cp > 1 ? " cp " + std::to_string(k.cp) + " " + vlm::sequence_mode_name(k.cp_mode) : ""));
  TensorMemoryMeter::install();
  vlm::VisionLanguageModel m(vlm::preset(k.preset), torch::TensorOptions().device(torch::kMeta));
  vlm::materialize(*m, {torch::kCPU, k.dtype, 0});
  apply_mix(*m, k.mix);
  m->train();
  const auto& c = m->cfg;
  auto runner = std::make_shared<MeterRunner>();
  m->set_runner(runner);
  if (k.cp > 1) m->set_sequence_exchange(std::make_shared<CopyExchange>(k.cp, k.cp_mode));
  const int64_t rows = 4, len = k.len;
  auto batch = make_batch(c, rows, len, k.gh, k.gw, k.dtype, k.packed);
  const int64_t base = TensorMemoryMeter::live_bytes();
  TensorMemoryMeter::reset_peak();
  auto out = m->forward(batch);
  const double fwd = static_cast<double>(TensorMemoryMeter::live_bytes() - base);
  TensorMemoryMeter::reset_peak();
  out.loss_sum.backward();
  const double bwd_peak = static_cast<double>(TensorMemoryMeter::peak_bytes() - base);

  vlm::app::MicroBatchShape shape{k.packed ? 1 : rows, k.packed ? rows * len : len, rows * k.gh * k.gw, out.n_tokens,
                             k.packed, k.packed ? rows : 1};
  shape.cp = k.cp;
  shape.cp_ring = k.cp_mode == vlm::SequenceMode::kRing;
  const auto plan = vlm::app::plan_activations(*m, shape, k.dtype);
  auto none = [](const std::string&) { return false; };
  size_t compared = 0;
  for (const auto& [path, added] : runner->added) {
    if (path == "lm_head") continue;  // its kept rows are cut before the unit runs
    if (k.cp > 1 && path == "model.embed_tokens") {  // the whole batch's, the chunk copied out later
      ++compared;
      continue;
    }
    auto it = std::find_if(plan.units.begin(), plan.units.end(), [&](const auto& u) { return u.path == path; });
    ASSERT_NE(it, plan.units.end()) << path << " is not in the plan";
    // Qwen3.5's decoder units allocate a few per-call tensors that are not per token (the
    // zero-centred norms' 1 + w, the conv's state prefix of each row, the chunk mask): the plan
    // counts per token, so those units are held to 0.2% (measured 0.0% to 0.13%); every other
    // unit to the byte.
    const bool per_call_extras = k.preset == "tiny-qwen3.5" && path.rfind("model.", 0) == 0;
    // Sparse layers (mixture of experts): the routed rows' tensors depend on how many rows
    // each expert gets only through per-expert pieces; the plan counts per routed row, held to
    // 2% (measured below).
    const bool sparse = k.preset.find("moe") != std::string::npos && path.rfind("model.layers.", 0) == 0;
    if (sparse)
      EXPECT_NEAR(it->kept_bytes / static_cast<double>(added), 1.0, 2e-2)
          << path << ": plan " << static_cast<int64_t>(it->kept_bytes) << " B, measured " << added << " B";
    else if (per_call_extras)
      EXPECT_NEAR(it->kept_bytes / static_cast<double>(added), 1.0, 2e-3)
          << path << ": plan " << static_cast<int64_t>(it->kept_bytes) << " B, measured " << added << " B";
    else
      EXPECT_EQ(it->kept_bytes, static_cast<double>(added))
          << path << ": plan " << static_cast<int64_t>(it->kept_bytes) << " B, measured " << added << " B";
    ++compared;
  }
  EXPECT_EQ(compared + 1, plan.units.size());
  EXPECT_NEAR(plan.forward_bytes(none) / fwd, 1.0, 0.01) << "plan " << plan.forward_bytes(none) << " measured " << fwd;
  if (k.absolute_peak)
    EXPECT_NEAR(plan.peak_bytes(none) / bwd_peak, 1.0, 0.05) << "plan " << plan.peak_bytes(none) << " measured "
                                                             << bwd_peak;
  std::printf("%-14s %-8s %-20s%s%s cp %lld forward end %10.0f plan %+.4f | peak %10.0f plan %+.4f\n",
              k.preset.c_str(), c10::toString(k.dtype), mix_name(k.mix), k.packed ? " packed" : "",
              k.gh == 0 ? " text" : "", static_cast<long long>(k.cp), fwd,
              plan.forward_bytes(none) / fwd - 1, bwd_peak, plan.peak_bytes(none) / bwd_peak - 1);
  if (measured) *measured = {bwd_peak, plan.peak_bytes(none)};
}

TEST(ActivationPlan, MatchesTheForwardOfEveryFamilyTrained) {
  for (const char* preset : {"tiny", "tiny-qwen2.5", "tiny-qwen3", "tiny-qwen3.5"})
    for (torch::Dtype dt : {torch::kFloat32, torch::kBFloat16}) check({preset, dt, Mix::trained});
}

TEST(ActivationPlan, MatchesWithAFrozenTowerAndWithLora) {
  for (const char* preset : {"tiny", "tiny-qwen2.5", "tiny-qwen3", "tiny-qwen3.5"})
    for (Mix mix : {Mix::frozen_vision, Mix::lora_qv, Mix::lora_all_dropout}) check({preset, torch::kFloat32, mix});
  check({"tiny", torch::kBFloat16, Mix::lora_qv});
  check({"tiny", torch::kBFloat16, Mix::frozen_vision});
}

TEST(ActivationPlan, MatchesTheForwardOfTheMoeFamilies) {
  for (const char* preset : {"tiny-qwen3-moe", "tiny-qwen3.5-moe"})
    for (torch::Dtype dt : {torch::kFloat32, torch::kBFloat16}) check({preset, dt, Mix::trained});
  check({"tiny-qwen3-moe", torch::kFloat32, Mix::frozen_vision});
  check({"tiny-qwen3.5-moe", torch::kFloat32, Mix::lora_qv});
}

TEST(ActivationPlan, MatchesPackedAndTextOnlyBatches) {
  check({"tiny", torch::kFloat32, Mix::trained, 8, 16, /*packed=*/true});
  check({"tiny-qwen3", torch::kBFloat16, Mix::trained, 8, 16, /*packed=*/true});
  check({"tiny-qwen3.5", torch::kFloat32, Mix::trained, 8, 16, /*packed=*/true});
  check({"tiny", torch::kFloat32, Mix::trained, 0, 0});
  check({"tiny-qwen2.5", torch::kBFloat16, Mix::frozen_vision, 0, 0});
}

// The peak's saving at cp against cp 1's (see the header comment).
void check_saving(Case k, int64_t cp) {
  k.absolute_peak = false;
  Measured one, split;
  check(k, &one);
  k.cp = cp;
  check(k, &split);
  const double saved = one.peak - split.peak, planned = one.planned_peak - split.planned_peak;
  EXPECT_GT(saved, 0);
  EXPECT_NEAR(planned / saved, 1.0, 0.01) << k.preset << " cp " << cp << ": peak saved " << saved << " B, planned "
                                          << planned << " B";
  std::printf("  cp %lld saves %.0f B of the peak (plan %+.4f)\n", static_cast<long long>(cp), saved,
              planned / saved - 1);
}

// Rows of 384 tokens: the peak stays in the loss head's backward at cp 4 too (with 96, the
// vision tower's backward, where most parameter gradients already exist, overtakes it).
TEST(ActivationPlan, MatchesRankZeroOfAContextParallelGroup) {
  for (int64_t cp : {2, 4}) {
    check_saving({"tiny", torch::kFloat32, Mix::trained, 8, 16, false, 1, 384}, cp);
    check_saving({"tiny-qwen3", torch::kBFloat16, Mix::frozen_vision, 8, 16, false, 1, 384}, cp);
    check_saving({"tiny-qwen2.5", torch::kFloat32, Mix::lora_qv, 8, 16, /*packed=*/true, 1, 384}, cp);
  }
  check_saving({"tiny", torch::kFloat32, Mix::trained, 0, 0, false, 1, 384}, 2);
  check_saving({"tiny-qwen3.5", torch::kFloat32, Mix::trained, 8, 16, false, 1, 384}, 2);
}

// Ring mode (rank 0 holds chunks 0 and 2 cp - 1; its attention keeps its own q / k / v).
TEST(ActivationPlan, MatchesRankZeroOfARingGroup) {
  const auto ring = vlm::SequenceMode::kRing;
  for (int64_t cp : {2, 4}) {
    check_saving({"tiny", torch::kFloat32, Mix::trained, 8, 16, false, 1, 384, true, ring}, cp);
    check_saving({"tiny-qwen2.5", torch::kFloat32, Mix::lora_qv, 8, 16, /*packed=*/true, 1, 384, true, ring}, cp);
  }
  check_saving({"tiny-qwen3", torch::kBFloat16, Mix::frozen_vision, 8, 16, false, 1, 384, true, ring}, 2);
  check_saving({"tiny-qwen3.5", torch::kFloat32, Mix::trained, 8, 16, false, 1, 384, true, ring}, 2);
}

}  // namespace
