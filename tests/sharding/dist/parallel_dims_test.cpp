// Launcher environment detection as a pure function of an env map (no processes).
#include <gtest/gtest.h>

#include "sharding/dist/fingerprint.h"
#include "sharding/dist/parallel_dims.h"
#include "vlm/runtime/check.h"
#include "vlm/runtime/runtime_info.h"

using namespace vlm::sharding;

namespace {

// Expects detect_dist_env(env) to throw a vlm::Error whose message contains every needle.
void expect_error(const EnvMap& env, const std::vector<std::string>& needles) {
  try {
    DistEnv d = detect_dist_env(env);
    FAIL() << "no error; got " << d.describe();
  } catch (const vlm::Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "missing '" << n << "' in: " << e.what();
  }
}

EnvMap torchrun_env() {
  return {{"RANK", "5"},          {"WORLD_SIZE", "8"},      {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"},  {"MASTER_ADDR", "10.0.0.7"},
          {"MASTER_PORT", "29400"}, {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_ERROR_FILE", "/tmp/e.json"},
          {"PATH", "/usr/bin"}};
}

}  // namespace

TEST(DistEnv, SingleProcessWhenNothingIsSet) {
  DistEnv d = detect_dist_env({{"PATH", "/usr/bin"}, {"HOME", "/root"}});
  EXPECT_EQ(d.launcher, Launcher::kSingle);
  EXPECT_EQ(d.rank, 0);
  EXPECT_EQ(d.world_size, 1);
  EXPECT_EQ(d.local_world_size, 1);
  EXPECT_EQ(d.master_port, 0);
  EXPECT_EQ(d.store_prefix(), "");
}

TEST(DistEnv, Torchrun) {
  DistEnv d = detect_dist_env(torchrun_env());
  EXPECT_EQ(d.launcher, Launcher::kTorchrun);
  EXPECT_EQ(d.rank, 5);
  EXPECT_EQ(d.world_size, 8);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_world_size, 4);
  EXPECT_EQ(d.node_rank, 1);
  EXPECT_EQ(d.master_addr, "10.0.0.7");
  EXPECT_EQ(d.master_port, 29400);
  EXPECT_TRUE(d.use_agent_store);
  EXPECT_EQ(d.restart_count, 2);
  EXPECT_EQ(d.store_prefix(), "/worker/attempt_2");
  EXPECT_EQ(d.error_file, "/tmp/e.json");
}

TEST(DistEnv, TorchrunWithoutAgentStoreAndNodeRankFromRanks) {
  EnvMap env = torchrun_env();
  env.erase("TORCHELASTIC_USE_AGENT_STORE");
  env.erase("GROUP_RANK");
  DistEnv d = detect_dist_env(env);
  EXPECT_FALSE(d.use_agent_store);
  EXPECT_EQ(d.store_prefix(), "");
  EXPECT_EQ(d.node_rank, 1);  // 5 / 4
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(detect_dist_env(env).use_agent_store);
}

TEST(DistEnv, TorchrunPartialOrInconsistent) {
  EnvMap env = torchrun_env();
  env.erase("WORLD_SIZE");
  expect_error(env, {"WORLD_SIZE is not set"});
  env = torchrun_env();
  env["RANK"] = "8";
  expect_error(env, {"RANK must be < WORLD_SIZE", "RANK=8", "WORLD_SIZE=8"});
  env = torchrun_env();
  env["LOCAL_RANK"] = "4";
  expect_error(env, {"LOCAL_RANK must be < LOCAL_WORLD_SIZE", "LOCAL_RANK=4"});
  env = torchrun_env();
  env["RANK"] = "two";
  expect_error(env, {"RANK", "expected a non-negative integer", "'two'"});
  env = torchrun_env();
  env["RANK"] = "-1";
  expect_error(env, {"'-1'"});
  env = torchrun_env();
  env.erase("MASTER_ADDR");
  expect_error(env, {"MASTER_ADDR is not"});
  env = torchrun_env();
  env["MASTER_PORT"] = "70000";
  expect_error(env, {"MASTER_PORT: expected 1..65535, got 70000"});
  env = torchrun_env();
  env.erase("LOCAL_RANK");
  expect_error(env, {"LOCAL_RANK is not set"});
  env = torchrun_env();
  env["LOCAL_WORLD_SIZE"] = "9";
  expect_error(env, {"LOCAL_WORLD_SIZE: expected 1..8"});
}

TEST(DistEnv, TorchrunWorldOneNeedsNoMaster) {
  DistEnv d = detect_dist_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(d.launcher, Launcher::kTorchrun);
  EXPECT_EQ(d.world_size, 1);
  EXPECT_EQ(d.local_world_size, 1);
}

TEST(DistEnv, TorchrunTakesPrecedenceOverSlurm) {
  EnvMap env = torchrun_env();
  env["SLURM_PROCID"] = "0";
  env["SLURM_NTASKS"] = "1";
  EXPECT_EQ(detect_dist_env(env).launcher, Launcher::kTorchrun);
}

TEST(DistEnv, Slurm) {
  EnvMap env = {{"SLURM_PROCID", "6"},       {"SLURM_NTASKS", "7"},
                {"SLURM_LOCALID", "0"},      {"SLURM_NODEID", "3"},
                {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                {"SLURM_JOB_NODELIST", "gpu[007-010,012],cpu1"}};
  DistEnv d = detect_dist_env(env);
  EXPECT_EQ(d.launcher, Launcher::kSlurm);
  EXPECT_EQ(d.rank, 6);
  EXPECT_EQ(d.world_size, 7);
  EXPECT_EQ(d.local_rank, 0);
  EXPECT_EQ(d.local_world_size, 1);  // node 3 is the "1" after three nodes of 2
  EXPECT_EQ(d.node_rank, 3);
  EXPECT_EQ(d.master_addr, "gpu007");
  EXPECT_EQ(d.master_port, 29500);
  EXPECT_FALSE(d.use_agent_store);
  // MASTER_ADDR / MASTER_PORT override the node list and the default port.
  env["MASTER_ADDR"] = "head";
  env["MASTER_PORT"] = "12345";
  env["SLURM_NTASKS_PER_NODE"] = "2";
  env["SLURM_NODEID"] = "0";
  env["SLURM_LOCALID"] = "1";
  d = detect_dist_env(env);
  EXPECT_EQ(d.master_addr, "head");
  EXPECT_EQ(d.master_port, 12345);
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.local_rank, 1);
}

TEST(DistEnv, SlurmPartialOrInconsistent) {
  expect_error({{"SLURM_PROCID", "0"}}, {"SLURM_NTASKS is not set"});
  expect_error({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}, {"MASTER_ADDR", "h"}},
               {"SLURM_PROCID must be < SLURM_NTASKS"});
  expect_error({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}, {"no master address"});
  expect_error({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"},
                {"MASTER_ADDR", "h"}},
               {"SLURM_NNODES=2"});
  expect_error({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "5"},
                {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"MASTER_ADDR", "h"}},
               {"lists 2 nodes", "SLURM_NODEID is 5"});
}

TEST(DistEnv, SlurmHostList) {
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("node1,node2"), "node1");
  EXPECT_EQ(first_slurm_host("gpu[003-005,9],cpu1"), "gpu003");
  EXPECT_EQ(first_slurm_host("rack[2,4]-n[01-08]"), "rack2-n01");
  EXPECT_EQ(first_slurm_host("a[10-11].cluster"), "a10.cluster");
  EXPECT_THROW(first_slurm_host("bad[1-2"), vlm::Error);
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("1,3(x2)", 2), 3);
}

TEST(DistEnv, ProcessEnvReadsEnviron) {
  ::setenv("VLMTRAIN_TEST_PROBE_VAR", "a=b", 1);
  EnvMap env = process_env();
  ASSERT_TRUE(env.count("VLMTRAIN_TEST_PROBE_VAR"));
  EXPECT_EQ(env["VLMTRAIN_TEST_PROBE_VAR"], "a=b");
  ::unsetenv("VLMTRAIN_TEST_PROBE_VAR");
}

TEST(ParallelDims, SingleProcessHasNoGroup) {
  ParallelDims p = ParallelDims::init(detect_dist_env({}), {});
  EXPECT_EQ(p.world_size(), 1);
  EXPECT_EQ(p.backend(), Backend::kNone);
  EXPECT_FALSE(p.store());
  EXPECT_FALSE(p.group());
  EXPECT_TRUE(p.device().is_cpu());
  EXPECT_FALSE(p.write_error_file("x"));  // no TORCHELASTIC_ERROR_FILE
}

// Published FNV-1a 64 test vectors.
TEST(Fingerprint, Fnv1a64Vectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(Fingerprint, StandardFieldsAndDuplicates) {
  Fingerprint fp = Fingerprint::standard("abc", "{}", "units", 42);
  ASSERT_EQ(fp.fields.size(), 5u);
  EXPECT_EQ(fp.fields[0].first, "recipe hash");
  EXPECT_EQ(fp.fields[3].second, "42");
  EXPECT_EQ(fp.fields[4].first, "libtorch version");
  EXPECT_EQ(fp.fields[4].second, vlm::torch_version());
  EXPECT_THROW(fp.add("recipe hash", "x"), vlm::Error);
}

// The NCCL environment: TORCH_NCCL_AVOID_RECORD_STREAMS=1 is set when absent, a user's value
// is kept (and then not reported as set).
TEST(ParallelDims, NcclEnvironmentDefaultsKeepTheUsersChoice) {
  const char* name = "TORCH_NCCL_AVOID_RECORD_STREAMS";
  const char* before = std::getenv(name);
  const std::string saved = before ? before : "";
  ::unsetenv(name);
  EXPECT_EQ(apply_nccl_env_defaults(), std::vector<std::string>{"TORCH_NCCL_AVOID_RECORD_STREAMS=1"});
  ASSERT_NE(std::getenv(name), nullptr);
  EXPECT_STREQ(std::getenv(name), "1");
  ::setenv(name, "0", 1);
  EXPECT_TRUE(apply_nccl_env_defaults().empty());
  EXPECT_STREQ(std::getenv(name), "0");
  if (before) ::setenv(name, saved.c_str(), 1); else ::unsetenv(name);
}
