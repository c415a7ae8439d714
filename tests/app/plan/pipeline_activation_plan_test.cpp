// The activation plan of a pipeline stage (app/plan/activation_memory.h, the model's
// set_pipeline_stage) against the tensor memory meter (vlm/runtime/tensor_memory.h): every
// stage of the tiny families at pp 2 (and tiny at pp 4), split by sharding::pipeline_split,
// runs forward_stage on one micro-batch as the schedule does (sharding/parallel/pipeline.h):
// a later stage's input allocated as the received [B, L, d] that requires grad, the output
// kept until backward. The bytes alive at the forward's end within 1.5% of the plan's
// forward_bytes, with and without the decoder layers checkpointed, fp32 and bf16 (small
// index and mask tensors outside the units are not modelled, as in activation_plan_ckpt_test).
// And the step's model: 1F1B keeps min(pp - s, m) micro-batches' forwards on stage s.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "app/plan/activation_memory.h"
#include "app/plan/memory_plan.h"
#include "app/plan/step_memory.h"
#include "sharding/parallel/activation_checkpoint.h"
#include "sharding/parallel/pipeline.h"
#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/runtime/tensor_memory.h"

namespace {

using vlm::TensorMemoryMeter;

// Recomputes the decoder layers in backward when `layers` (as the trainer's checkpoint policy).
struct StageCkptRunner : vlm::UnitRunner {
  bool layers = false;
  torch::Tensor run(const std::string& path, torch::nn::Module& unit, const torch::Tensor& x,
                    const std::function<torch::Tensor(const torch::Tensor&)>& fn) override {
    if (!layers || path.rfind("model.layers.", 0) != 0) return fn(x);
    return vlm::sharding::checkpoint_unit(x, unit.parameters(), fn, {});
  }
};

// rows x len tokens, one image of (1, gh, gw) patches per row, the second half supervised.
vlm::Batch stage_batch(const vlm::VlmConfig& c, int64_t rows, int64_t len, int64_t gh, int64_t gw, torch::Dtype dt) {
  const int64_t n_img = gh * gw / c.vision.merge_unit();
  vlm::Batch b;
  b.input_ids = torch::full({rows, len}, int64_t{5}, torch::kInt64);
  b.labels = torch::full({rows, len}, int64_t{-100}, torch::kInt64);
  for (int64_t r = 0; r < rows; ++r) {
    b.input_ids[r][1] = c.vision_start_token_id;
    for (int64_t i = 0; i < n_img; ++i) b.input_ids[r][2 + i] = c.image_token_id;
    b.input_ids[r][2 + n_img] = c.vision_end_token_id;
    for (int64_t t = len / 2; t < len; ++t) b.labels[r][t] = 7 + t % 11;
  }
  b.attention_mask = torch::ones({rows, len}, torch::kInt64);
  b.right_padded = true;
  b.pixel_values = torch::randn({rows * gh * gw, c.vision.patch_dim()}).to(dt);
  b.image_grid_thw = torch::tensor({int64_t{1}, gh, gw}, torch::kInt64).view({1, 3}).repeat({rows, 1});
  return b;
}

void check_stages(const std::string& preset, torch::Dtype dt, int64_t pp, bool ckpt) {
  const int64_t rows = 4, len = 96, gh = 8, gw = 16;
  TensorMemoryMeter::install();
  vlm::VisionLanguageModel probe(vlm::preset(preset), torch::TensorOptions().device(torch::kMeta));
  const auto stages = vlm::sharding::pipeline_split(*probe, pp);
  for (const auto& stage : stages) {
    SCOPED_TRACE(preset + " " + c10::toString(dt) + " pp " + std::to_string(pp) + " stage " +
                 std::to_string(stage.index) + (ckpt ? " ckpt" : ""));
    vlm::VisionLanguageModel m(vlm::preset(preset), torch::TensorOptions().device(torch::kMeta));
    vlm::materialize(*m, {torch::kCPU, dt, 0});
    m->train();
    auto runner = std::make_shared<StageCkptRunner>();
    runner->layers = ckpt;
    m->set_runner(runner);
    m->set_pipeline_stage(stage);
    const vlm::Batch batch = stage_batch(m->cfg, rows, len, gh, gw, dt);
    const int64_t supervised = (batch.labels.narrow(1, 1, len - 1) != -100).sum().item<int64_t>();
    const int64_t base = TensorMemoryMeter::live_bytes();
    torch::Tensor input;  // the schedule's received activation
    if (!stage.first()) input = torch::randn({rows, len, m->cfg.text.hidden_size}).to(dt).requires_grad_(true);
    auto out = m->forward_stage(batch, input);
    const double fwd = static_cast<double>(TensorMemoryMeter::live_bytes() - base);
    const auto plan = vlm::app::plan_activations(*m, {rows, len, rows * gh * gw, supervised, false}, dt);
    auto checkpointed = [&](const std::string& p) { return ckpt && p.rfind("model.layers.", 0) == 0; };
    const double planned = plan.forward_bytes(checkpointed);
    std::printf("%s %s pp %lld stage %lld%s: forward end %.0f, plan %+.4f\n", preset.c_str(), c10::toString(dt),
                static_cast<long long>(pp), static_cast<long long>(stage.index), ckpt ? " ckpt" : "", fwd,
                planned / fwd - 1);
    EXPECT_NEAR(planned / fwd, 1.0, 0.015) << "plan " << planned << " measured " << fwd;
  }
}

TEST(PipelineActivationPlan, EachStageMatchesTheMeter) {
  for (const char* preset : {"tiny", "tiny-qwen2.5", "tiny-qwen3", "tiny-qwen3.5"})
    for (torch::Dtype dt : {torch::kFloat32, torch::kBFloat16})
      for (bool ckpt : {false, true}) check_stages(preset, dt, 2, ckpt);
  check_stages("tiny", torch::kFloat32, 4, false);
}

// StepMemoryModel on stage s of pp: the activation moments hold min(pp - s, m) - 1 other
// micro-batches' forward ends beside one micro-batch's peak.
TEST(PipelineActivationPlan, StepHoldsTheMicroBatchesInFlight) {
  vlm::VisionLanguageModel m(vlm::preset("tiny"), torch::TensorOptions().device(torch::kMeta));
  const int64_t pp = 3, mbs = 2;
  const auto stages = vlm::sharding::pipeline_split(*m, pp);
  const vlm::app::MicroBatchShape shape{2, 64, 2 * 64, 40, false};
  auto none = [](const std::string&) { return false; };
  for (const auto& stage : stages) {
    m->set_pipeline_stage(stage);
    const vlm::app::MemoryPlan mem;
    const vlm::app::StepMemoryModel model(*m, mem, {}, torch::kFloat32, vlm::app::AttentionPath::cpu, 0);
    const auto step = model.step(shape, mbs, 4);
    const auto one = vlm::app::plan_activations(*m, shape, torch::kFloat32);
    const int64_t in_flight = std::min(pp - stage.index, mbs);
    EXPECT_EQ(step.in_flight, in_flight) << "stage " << stage.index;
    const double others = static_cast<double>(in_flight - 1) * one.forward_bytes(none);
    EXPECT_DOUBLE_EQ(step.act_head, one.head_peak_bytes(none) + others) << "stage " << stage.index;
    EXPECT_DOUBLE_EQ(step.act_units, one.units_peak_bytes(none) + others) << "stage " << stage.index;
  }
}

}  // namespace
