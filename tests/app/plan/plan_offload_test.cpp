// `vlmtrain plan` with sharding.optimizer_offload = true (sharding/parallel/offload.h plan_offload):
// ocr_qwen.toml on the 2B preset at N = 8 (frozen vision, merger ddp, LLM fsdp full_shard,
// bf16): the device bytes are the plan without offload minus its optimizer bytes, which
// reappear as host bytes at 16 B per state element (fp32 master, m, v, grad staging): the
// merger 16P, each FSDP unit 16P/N, frozen units 0.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/testing.h"

namespace {

nlohmann::json plan_offload_json(bool offload) {
  const std::string recipe = vlm::test::source_dir() + "/recipes/ocr_qwen.toml";
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--preset", "qwen2-vl-2b", "--world-size", "8",
                         "--json", "--set", std::string("sharding.optimizer_offload=") + (offload ? "true" : "false")});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

TEST(PlanOffload, OptimizerBytesMoveToHost) {
  const nlohmann::json on = plan_offload_json(false), off = plan_offload_json(true);
  EXPECT_FALSE(on["optimizer_offload"].get<bool>());
  EXPECT_TRUE(off["optimizer_offload"].get<bool>());
  const double optim = on["totals"]["optim_bytes"].get<double>();
  ASSERT_GT(optim, 0);
  EXPECT_EQ(on["offload_saved_bytes"].get<double>(), 0);
  EXPECT_EQ(on["totals"]["host_optim_bytes"].get<double>(), 0);
  EXPECT_EQ(off["offload_saved_bytes"].get<double>(), optim);
  EXPECT_EQ(off["totals"]["optim_bytes"].get<double>(), 0);
  EXPECT_EQ(off["totals"]["total_bytes"].get<double>(), on["totals"]["total_bytes"].get<double>() - optim);
  EXPECT_EQ(off["peak_bytes"].get<double>(), on["peak_bytes"].get<double>() - optim);
  EXPECT_EQ(off["totals"]["param_bytes"], on["totals"]["param_bytes"]);
  EXPECT_EQ(off["totals"]["grad_bytes"], on["totals"]["grad_bytes"]);
  ASSERT_EQ(off["units"].size(), on["units"].size());
  double host = 0;
  for (size_t i = 0; i < off["units"].size(); ++i) {
    const auto& u = off["units"][i];
    const std::string path = u["path"], policy = u["policy"];
    const double p = u["params"].get<double>();
    const double want = policy == "freeze" ? 0 : policy == "ddp" ? 16 * p : 16 * p / 8;
    EXPECT_EQ(u["host_optim_bytes"].get<double>(), want) << path;
    EXPECT_EQ(u["optim_bytes"].get<double>(), 0) << path;
    EXPECT_EQ(u["total_bytes"].get<double>(),
              on["units"][i]["total_bytes"].get<double>() - on["units"][i]["optim_bytes"].get<double>())
        << path;
    host += want;
  }
  EXPECT_EQ(off["totals"]["host_optim_bytes"].get<double>(), host);
  // Published groups: merger 16P, LLM 16P/8.
  EXPECT_EQ(host, 16 * 34087936.0 + 16 * 1543714304.0 / 8);
}

TEST(PlanOffload, HumanTableShowsHostBytesAndSaving) {
  const std::string recipe = vlm::test::source_dir() + "/recipes/ocr_qwen.toml";
  auto r = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--preset", "qwen2-vl-2b", "--world-size", "8",
                         "--set", "sharding.optimizer_offload=true"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("optimizer_offload: optimizer state in host memory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("device memory saved"), std::string::npos) << r.output;
  auto plain = vlm::test::run({vlm::test::vlmtrain_bin(), "plan", recipe, "--preset", "qwen2-vl-2b", "--world-size", "8"});
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(plain.output.find("optimizer_offload:"), std::string::npos) << plain.output;
}

}  // namespace
