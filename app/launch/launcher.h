// The built-in launcher behind `vlmtrain launch`: torchrun's worker semantics without Python.
//
//   LaunchOptions o = parse_launch_args(argv_after_launch, "/path/to/vlmtrain");
//   int code = run_launcher(o);        // spawns, supervises, returns the exit code
//
// What each worker gets (the variables torchrun sets, same names and meanings):
//   RANK = node_rank * nproc_per_node + local_rank   WORLD_SIZE = nnodes * nproc_per_node
//   LOCAL_RANK, LOCAL_WORLD_SIZE = nproc_per_node     GROUP_RANK = node_rank
//   GROUP_WORLD_SIZE = nnodes   ROLE_RANK = RANK   ROLE_WORLD_SIZE = WORLD_SIZE
//   ROLE_NAME = default   MASTER_ADDR, MASTER_PORT   TORCHELASTIC_RUN_ID
//   TORCHELASTIC_RESTART_COUNT = 0   TORCHELASTIC_MAX_RESTARTS = 0
//   TORCHELASTIC_USE_AGENT_STORE = False (there is no agent store: rank 0 hosts the
//   TCPStore, see sharding/dist/parallel_dims.h)   TORCHELASTIC_ERROR_FILE = a per-rank file
//   OMP_NUM_THREADS = 1 unless already set (as torchrun does when nproc_per_node > 1).
// Launcher variables inherited from an outer launcher (SLURM_*, other TORCHELASTIC_*) are
// removed so the worker sees exactly one launcher.
//
// Supervision (torchrun's rules, without restarts):
//   * each worker runs in its own process group, dies with the launcher (PDEATHSIG), and
//     its stdout/stderr lines are copied to the launcher's stdout/stderr prefixed
//     "[rank R] " (whole lines; a last unterminated line is flushed at exit);
//   * SIGINT / SIGTERM / SIGHUP to the launcher are forwarded to every worker; workers
//     still alive after `grace` get SIGKILL; the launcher exits 128 + signal;
//   * the first worker to exit non-zero (or die of a signal) is the failure: the others get
//     SIGTERM, then SIGKILL after `grace`, and the launcher exits 1 with a message naming
//     that rank, its exit code or signal, and the message of its error file if it wrote one;
//   * all workers exit 0 -> the launcher exits 0.
// Several nodes: one launcher per node with the same --nnodes, --master-addr and
// --master-port and its own --node-rank; each supervises only its local workers (a failure
// on one node reaches the others through the collectives' dead-peer / timeout errors).
#pragma once
#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace vlm::app {

struct LaunchOptions {
  int nproc_per_node = 1;   // workers on this node
  int nnodes = 1;           // launchers (nodes) in the job
  int node_rank = 0;        // this node, in [0, nnodes)
  std::string master_addr;  // host of rank 0; 127.0.0.1 when nnodes == 1 and not given
  int master_port = 0;      // 0: pick a free port (only when nnodes == 1)
  std::string log_dir;      // "": error files in a temporary directory removed at exit;
                            // else <log_dir>/rank<R>.log (unprefixed output) and
                            // <log_dir>/rank<R>.error.json are kept
  std::string run_id;       // TORCHELASTIC_RUN_ID; "" -> "none" (torchrun's default)
  std::chrono::milliseconds grace{std::chrono::seconds(30)};  // SIGTERM -> SIGKILL (torchrun: 30 s)
  std::vector<std::string> worker_argv;  // program and its arguments
};

// Parses the arguments after `vlmtrain launch`:
//   [--nproc-per-node N] [--nnodes M] [--node-rank R] [--master-addr A] [--master-port P]
//   [--log-dir DIR] [--run-id ID] [--grace-s S]
//   ( [train|eval] RECIPE [args...]  |  --exec PROGRAM [args...] )
// Launcher options come first (--name V or --name=V); the first other token starts the
// worker command line, which is passed on unchanged. A worker command that is neither
// `train`, `eval` nor --exec is `train` (`vlmtrain launch RECIPE` = `... train RECIPE`).
// `self_exe` is the vlmtrain binary that runs train/eval. Throws vlm::Error on bad input.
// Defined in app/cli/cmd_launch.cpp, beside the declaration of the options.
LaunchOptions parse_launch_args(const std::vector<std::string>& args, const std::string& self_exe);

// The environment of worker `local_rank`: `base` without inherited launcher variables, plus
// the torchrun variables listed above. "K=V" strings, sorted by key.
std::vector<std::string> worker_env(const LaunchOptions& o, int local_rank,
                                    const std::map<std::string, std::string>& base,
                                    const std::string& error_file);

// A TCP port that was free on all interfaces a moment ago.
int pick_free_port();

// Spawns the workers and supervises them as described above; returns the launcher's exit
// code (0, 1, or 128 + signal). Throws vlm::Error if a worker cannot be started.
int run_launcher(const LaunchOptions& o);

}  // namespace vlm::app
