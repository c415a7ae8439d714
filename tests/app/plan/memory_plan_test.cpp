// Planned vs measured memory, end to end: the trainer logs for every step the measured peak
// of tensor bytes (tensor_peak_bytes: vlm/runtime/tensor_memory.h counts every CPU storage) and the
// plan for the micro-batches it ran (tensor_peak_planned_bytes: app/plan/step_memory.h). The plan
// must come within 10% at every step for each policy mix (issue #29's target; the
// measurement is the allocator's, independent of the plan's arithmetic). And `vlmtrain plan`
// reports activations that follow the micro-batch and the policies.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/app/train/train_testing.h"
#include "tests/testing.h"

namespace {

// The tiny recipe with its [sharding] section (up to [dist]) replaced by `block`.
std::string recipe_with(const std::string& block) {
  const std::string base = vlm::test::read_file(vlm::test::source_dir() + "/recipes/ocr_tiny.toml");
  const size_t a = base.find("[sharding]"), b = base.find("[dist]");
  EXPECT_NE(a, std::string::npos);
  EXPECT_NE(b, std::string::npos);
  return base.substr(0, a) + block + "\n" + base.substr(b);
}

void expect_plan_within_10pct(const std::string& name, const std::string& block,
                              const std::vector<std::string>& sets = {}) {
  SCOPED_TRACE(name);
  vlm::test::TempDir dir("memplan");
  vlm::test::make_synth_data(dir / "data", 64, 5);
  const std::string recipe = dir / "recipe.toml";
  vlm::test::write_file(recipe, recipe_with(block));
  auto args = vlm::test::tiny_train_args(dir / "run", dir / "data", 3, 0);
  args[2] = recipe;
  for (const auto& s : {"batch.samples_per_rank=8", "log.tensorboard=false", "checkpoint.save_final=false"}) {
    args.push_back("--set");
    args.push_back(s);
  }
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  auto r = vlm::test::run(args, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int steps = 0;
  for (const auto& j : vlm::test::metrics_lines(dir / "run")) {
    if (!j.contains("tensor_peak_planned_bytes")) continue;
    const double measured = j["tensor_peak_bytes"].get<double>(), planned = j["tensor_peak_planned_bytes"].get<double>();
    ASSERT_GT(measured, 0);
    EXPECT_NEAR(planned / measured, 1.0, 0.10) << "step " << j["step"] << ": planned " << planned << " measured "
                                               << measured;
    ++steps;
  }
  EXPECT_EQ(steps, 3);
}

const char* kFsdpAll = "[sharding]\ndefault = \"fsdp\"\ndefault_strategy = \"full_shard\"\n";

TEST(TrainMemoryPlan, DefaultMixAndAllDdpWithin10Percent) {
  expect_plan_within_10pct("tiny default", "[sharding]\ndefault = \"ddp\"\n[[sharding.module]]\n"
                                           "match = \"visual.patch_embed|visual.blocks.*|model.layers.*\"\n"
                                           "policy = \"fsdp\"\nstrategy = \"full_shard\"\n");
  expect_plan_within_10pct("all ddp", "[sharding]\ndefault = \"ddp\"\n");
}

TEST(TrainMemoryPlan, CheckpointingLoraAndFrozenTowerWithin10Percent) {
  expect_plan_within_10pct("full_shard + checkpointed layers",
                           std::string(kFsdpAll) + "[activation_checkpointing]\nmatch = \"model.layers.*\"\n");
  expect_plan_within_10pct("lora, rest frozen",
                           "[sharding]\ndefault = \"freeze\"\n[[sharding.module]]\n"
                           "match = \"model.layers.*.self_attn.q_proj|model.layers.*.mlp.*\"\n"
                           "policy = \"lora\"\nr = 8\nalpha = 16\ndropout = 0.05\n");
  expect_plan_within_10pct("frozen vision, bf16",
                           std::string(kFsdpAll) + "[[sharding.module]]\nmatch = \"visual.patch_embed|visual.blocks.*\"\n"
                                                   "policy = \"freeze\"\n",
                           {"precision.param_dtype=bf16"});
}

nlohmann::json plan_json(const std::vector<std::string>& extra, const std::string& recipe = "ocr_tiny.toml") {
  std::vector<std::string> argv = {vlm::test::vlmtrain_bin(), "plan", vlm::test::source_dir() + "/recipes/" + recipe,
                                   "--json", "--device", "cpu"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto r = vlm::test::run(argv);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

double unit_activation(const nlohmann::json& j, const std::string& path) {
  for (const auto& u : j["units"])
    if (u["path"] == path) return u["activation_bytes"].get<double>();
  ADD_FAILURE() << path << " not in the plan";
  return 0;
}

// Per token, a decoder layer keeps (fp32, all trained; app/plan/activation_memory.h):
// 6 d + 2 H D + 2 Hkv D + 4 I floats + H (logsumexp) + 2 (rsqrt) = 5382 floats at the tiny
// preset (d 256, I 768, H 4, Hkv 2, D 64).
TEST(Plan, ActivationsFollowTheMicroBatchAndThePolicies) {
  auto j = plan_json({"--tokens", "1000", "--image-tokens", "100"});
  EXPECT_EQ(j["activations"]["tokens"], 1000);
  EXPECT_EQ(j["activations"]["patches"], 400);
  EXPECT_EQ(unit_activation(j, "model.layers.0"), 1000.0 * 5382 * 4);
  double units = 0;
  for (const auto& u : j["units"]) units += u["activation_bytes"].get<double>();
  const double fwd = j["activations"]["forward_bytes"].get<double>();
  EXPECT_GT(fwd, units);  // plus the rotary tables and position ids
  EXPECT_LT(fwd, units * 1.05);
  EXPECT_GE(j["activations"]["peak_bytes"].get<double>(), fwd);
  const auto& s = j["step_peak"];
  const double gathered = s["gathered_bytes"].get<double>(), reduce = s["reduce_scatter_bytes"].get<double>();
  EXPECT_DOUBLE_EQ(s["total_bytes"].get<double>(),
                   s["persistent_bytes"].get<double>() + s["inputs_bytes"].get<double>() +
                       std::max(gathered + std::max(s["loss_backward_activation_bytes"].get<double>(),
                                                    reduce + s["unit_backward_activation_bytes"].get<double>()) +
                                    s["unit_grad_bytes"].get<double>(),
                                reduce + s["step_grad_bytes"].get<double>()));
  EXPECT_DOUBLE_EQ(std::max(s["loss_backward_activation_bytes"].get<double>(),
                            s["unit_backward_activation_bytes"].get<double>()),
                   j["activations"]["peak_bytes"].get<double>());
  // Twice the tokens: twice a layer's activations.
  auto j2 = plan_json({"--tokens", "2000", "--image-tokens", "100"});
  EXPECT_EQ(unit_activation(j2, "model.layers.0"), 2 * unit_activation(j, "model.layers.0"));
  // Checkpointed layers keep only their input (the previous unit's output, d floats a token).
  auto ck = plan_json({"--tokens", "1000", "--image-tokens", "100", "--set", "activation_checkpointing.match=model.layers.*"});
  EXPECT_EQ(unit_activation(ck, "model.layers.1"), 1000.0 * 256 * 4);
  EXPECT_LT(ck["activations"]["forward_bytes"].get<double>(), 0.5 * fwd);
  // A frozen tower builds no graph: its blocks keep nothing (the LoRA recipe: everything
  // frozen but the attention adapters, which keep the layers' activations).
  auto fr = plan_json({"--preset", "tiny", "--tokens", "1000", "--image-tokens", "100"}, "ocr_qwen_lora.toml");
  EXPECT_EQ(unit_activation(fr, "visual.blocks.0"), 0);
  EXPECT_GT(unit_activation(fr, "model.layers.1"), 0);
  EXPECT_LT(unit_activation(fr, "model.layers.1"), unit_activation(j, "model.layers.1"));
  EXPECT_GT(unit_activation(j, "visual.blocks.0"), 0);
}

TEST(Plan, ActivationFlagsAreChecked) {
  for (const auto& bad : std::vector<std::vector<std::string>>{{"--tokens", "10", "--image-tokens", "11"},
                                                               {"--device", "tpu"}}) {
    std::vector<std::string> argv = {vlm::test::vlmtrain_bin(), "plan", vlm::test::source_dir() + "/recipes/ocr_tiny.toml"};
    argv.insert(argv.end(), bad.begin(), bad.end());
    auto r = vlm::test::run(argv);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(bad[bad.size() - 2]), std::string::npos) << r.output;
  }
}

}  // namespace
