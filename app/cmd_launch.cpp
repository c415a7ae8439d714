// `vlmtrain launch`: spawn N workers with the torchrun environment (no Python needed).
#include <unistd.h>

#include <cstdio>

#include "app/commands.h"
#include "app/launcher.h"
#include "vlm/check.h"

namespace vlmtrain {

const char* help_launch() {
  return R"(usage: vlmtrain launch [--nproc-per-node N] [--nnodes M --node-rank R --master-addr A
                       --master-port P] [--log-dir DIR] [train|eval] RECIPE [ARGS...]
       vlmtrain launch [launcher options] --exec PROGRAM [ARGS...]

Starts N worker processes on this node with the environment torchrun gives its workers
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_RUN_ID, TORCHELASTIC_ERROR_FILE, ...). By default each worker
runs `vlmtrain train RECIPE ARGS...`; `eval` runs `vlmtrain eval`; --exec runs any program.

Worker output lines are prefixed "[rank R] ". SIGINT/SIGTERM/SIGHUP are forwarded to the
workers. When a worker fails (non-zero exit or signal) the others are stopped (SIGTERM,
then SIGKILL after the grace period) and the launcher exits 1 naming the first failing
rank, its exit code or signal, and the message from its error file. No restarts.

options (before the worker command):
  --nproc-per-node N   workers on this node (default 1)
  --nnodes M           nodes in the job, one launcher per node (default 1)
  --node-rank R        this node's index in [0, M) (required when M > 1)
  --master-addr A      address of node 0 reachable from every node (required when M > 1;
                       default 127.0.0.1)
  --master-port P      rendezvous port on node 0 (required when M > 1; default: a free port)
  --log-dir DIR        keep each rank's output (DIR/rank<R>.log) and error file
                       (DIR/rank<R>.error.json); default: error files in a temporary dir
  --run-id ID          TORCHELASTIC_RUN_ID (default "none")
  --grace-s S          seconds between SIGTERM and SIGKILL when stopping workers
                       (default 30, as torchrun; the trainer checkpoints on SIGTERM)

examples:
  vlmtrain launch --nproc-per-node 2 recipes/ocr_tiny.toml --set optim.lr=5e-4
  # two nodes (run on each, NODE_RANK = 0 or 1):
  vlmtrain launch --nnodes 2 --node-rank $NODE_RANK --nproc-per-node 8 \
      --master-addr node0.cluster --master-port 29500 recipes/ocr_qwen.toml
)";
}

int cmd_launch(Args& args) {
  const auto& raw = args.raw();
  // --help among the launcher's own options (the worker's --help goes to the worker).
  for (size_t i = 0; i < raw.size(); ++i) {
    const std::string& a = raw[i];
    if (a == "--help" || a == "-h") {
      std::fputs(help_launch(), stdout);
      return 0;
    }
    if (a.rfind("--", 0) != 0 || a == "--exec" || a == "--") break;
    if (a.find('=') == std::string::npos) ++i;  // skip the option's value
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  VLM_CHECK(n > 0, "vlmtrain launch: cannot find the vlmtrain binary (readlink /proc/self/exe)");
  self[n] = '\0';
  LaunchOptions o = parse_launch_args(raw, self);
  return run_launcher(o);
}

}  // namespace vlmtrain
