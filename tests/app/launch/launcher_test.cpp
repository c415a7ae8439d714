// `vlmtrain launch` argument parsing and the worker environment (pure functions; the
// processes are exercised in launch_dist_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>

#include "app/launch/launcher.h"
#include "sharding/dist/parallel_dims.h"
#include "vlm/runtime/check.h"

using vlm::app::LaunchOptions;
using vlm::app::parse_launch_args;

namespace {

std::string expect_error(const std::vector<std::string>& args) {
  try {
    parse_launch_args(args, "/bin/vlmtrain");
  } catch (const vlm::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for the arguments";
  return "";
}

std::map<std::string, std::string> to_map(const std::vector<std::string>& kv) {
  std::map<std::string, std::string> m;
  for (const auto& e : kv) m[e.substr(0, e.find('='))] = e.substr(e.find('=') + 1);
  return m;
}

}  // namespace

TEST(LaunchArgs, RecipeMeansTrainAndTheTailPassesThrough) {
  LaunchOptions o = parse_launch_args({"--nproc-per-node", "2", "r.toml", "--set", "optim.lr=1",
                                       "--dry-run"},
                                      "/bin/vlmtrain");
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 0);
  EXPECT_EQ(o.worker_argv, (std::vector<std::string>{"/bin/vlmtrain", "train", "r.toml", "--set",
                                                     "optim.lr=1", "--dry-run"}));
}

TEST(LaunchArgs, SubcommandsExecAndEqualsForm) {
  LaunchOptions e = parse_launch_args({"--nproc-per-node=3", "eval", "r.toml", "--help"}, "/v");
  EXPECT_EQ(e.nproc_per_node, 3);
  EXPECT_EQ(e.worker_argv, (std::vector<std::string>{"/v", "eval", "r.toml", "--help"}));
  LaunchOptions t = parse_launch_args({"train", "r.toml"}, "/v");
  EXPECT_EQ(t.worker_argv, (std::vector<std::string>{"/v", "train", "r.toml"}));
  LaunchOptions x = parse_launch_args({"--grace-s", "2", "--exec", "sh", "-c", "echo --nnodes 3"}, "/v");
  EXPECT_EQ(x.grace, std::chrono::seconds(2));
  EXPECT_EQ(x.nnodes, 1);
  EXPECT_EQ(x.worker_argv, (std::vector<std::string>{"sh", "-c", "echo --nnodes 3"}));
  // torchrun's spellings work too.
  LaunchOptions u = parse_launch_args({"--nproc_per_node", "4", "--", "--weird-program"}, "/v");
  EXPECT_EQ(u.nproc_per_node, 4);
  EXPECT_EQ(u.worker_argv, (std::vector<std::string>{"/v", "train", "--weird-program"}));
}

TEST(LaunchArgs, MultiNodeNeedsRendezvousFacts) {
  LaunchOptions o = parse_launch_args({"--nnodes", "2", "--node-rank", "1", "--master-addr",
                                       "10.0.0.1", "--master-port", "29500",
                                       "--nproc-per-node", "4", "r.toml"},
                                      "/v");
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  std::string m = expect_error({"--nnodes", "2", "--node-rank", "0", "r.toml"});
  EXPECT_NE(m.find("missing: --master-addr --master-port"), std::string::npos) << m;
  m = expect_error({"--nnodes", "2", "--node-rank", "2", "--master-addr", "a", "--master-port",
                    "1", "r.toml"});
  EXPECT_NE(m.find("--node-rank must be < --nnodes"), std::string::npos) << m;
}

TEST(LaunchArgs, BadInputIsNamed) {
  std::string m = expect_error({"--nproc-per-node", "0", "r.toml"});
  EXPECT_NE(m.find("--nproc-per-node expects an integer in [1, 4096], got '0'"), std::string::npos) << m;
  m = expect_error({"--nproc-per-node", "2"});
  EXPECT_NE(m.find("missing the worker command"), std::string::npos) << m;
  m = expect_error({"--nprocs", "2", "r.toml"});
  EXPECT_NE(m.find("unknown option --nprocs"), std::string::npos) << m;
  m = expect_error({"--exec"});
  EXPECT_NE(m.find("--exec needs a PROGRAM"), std::string::npos) << m;
  m = expect_error({"--master-port", "70000", "r.toml"});
  EXPECT_NE(m.find("--master-port expects an integer in [1, 65535]"), std::string::npos) << m;
}

// The environment is what torchrun gives, and what our own detect_dist_env reads back.
TEST(LaunchEnv, TorchrunVariablesAndNoInheritedLauncher) {
  LaunchOptions o = parse_launch_args({"--nnodes", "2", "--node-rank", "1", "--master-addr",
                                       "node0", "--master-port", "29500", "--nproc-per-node", "3",
                                       "--run-id", "job7", "r.toml"},
                                      "/v");
  std::map<std::string, std::string> base = {{"PATH", "/usr/bin"},
                                             {"SLURM_PROCID", "5"},
                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                             {"RANK", "9"},
                                             {"OMP_NUM_THREADS", "4"}};
  auto env = to_map(vlm::app::worker_env(o, 2, base, "/tmp/e/rank5.error.json"));
  EXPECT_EQ(env["PATH"], "/usr/bin");
  EXPECT_EQ(env.count("SLURM_PROCID"), 0u);
  EXPECT_EQ(env["RANK"], "5");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["WORLD_SIZE"], "6");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(env["ROLE_RANK"], "5");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "6");
  EXPECT_EQ(env["ROLE_NAME"], "default");
  EXPECT_EQ(env["MASTER_ADDR"], "node0");
  EXPECT_EQ(env["MASTER_PORT"], "29500");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job7");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "False");
  EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"], "/tmp/e/rank5.error.json");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "4");  // kept when the user set it

  auto d = vlm::sharding::detect_dist_env(env);
  EXPECT_EQ(d.launcher, vlm::sharding::Launcher::kTorchrun);
  EXPECT_EQ(d.rank, 5);
  EXPECT_EQ(d.world_size, 6);
  EXPECT_EQ(d.local_rank, 2);
  EXPECT_EQ(d.local_world_size, 3);
  EXPECT_EQ(d.node_rank, 1);
  EXPECT_FALSE(d.use_agent_store);
  EXPECT_EQ(d.error_file, "/tmp/e/rank5.error.json");

  base.erase("OMP_NUM_THREADS");
  auto env2 = to_map(vlm::app::worker_env(o, 0, base, "f"));
  EXPECT_EQ(env2["OMP_NUM_THREADS"], "1");  // torchrun's default with several workers
}

TEST(LaunchEnv, FreePortIsUsable) {
  const int p = vlm::app::pick_free_port();
  EXPECT_GT(p, 0);
  EXPECT_LE(p, 65535);
}
