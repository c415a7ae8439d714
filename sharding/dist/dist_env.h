// DistEnv: this process's place in the job, read from the launcher's environment variables
// (the only reader of `environ` in sharding/). Pure: an env map in, facts (or an Error) out,
// testable without processes; ParallelDims::init (parallel_dims.h) connects from them.
//
//   DistEnv env = detect_dist_env(process_env());
//
// Launchers, in order of precedence:
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//             (+ GROUP_RANK as node rank). With TORCHELASTIC_USE_AGENT_STORE=True the agent
//             already hosts a TCPStore at MASTER_ADDR:MASTER_PORT: every worker connects as
//             a client under the prefix "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>".
//             Without it, rank 0 hosts the TCPStore and the others connect.
//   Slurm     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID (+ SLURM_NTASKS_PER_NODE
//             or SLURM_TASKS_PER_NODE for the local world size). Master: MASTER_ADDR, else the
//             first host of SLURM_JOB_NODELIST (SLURM_NODELIST); port: MASTER_PORT, else 29500.
//             Rank 0 hosts the TCPStore.
//   single    none of the above: world size 1, no store, no group.
#pragma once
#include <map>
#include <string>

namespace vlm::sharding {

using EnvMap = std::map<std::string, std::string>;

// This process's environment as a map (the only reader of `environ` in sharding/).
EnvMap process_env();

enum class Launcher { kSingle, kTorchrun, kSlurm };
const char* launcher_name(Launcher l);

// Facts about this process's place in the job, read from the environment.
struct DistEnv {
  Launcher launcher = Launcher::kSingle;
  int rank = 0;              // global rank in [0, world_size)
  int world_size = 1;
  int local_rank = 0;        // rank on this node in [0, local_world_size)
  int local_world_size = 1;
  int node_rank = 0;         // GROUP_RANK (torchrun) / SLURM_NODEID
  std::string master_addr;   // empty for kSingle
  int master_port = 0;       // 0 for kSingle
  bool use_agent_store = false;  // torchrun's TORCHELASTIC_USE_AGENT_STORE=True
  int restart_count = 0;         // TORCHELASTIC_RESTART_COUNT
  std::string error_file;        // TORCHELASTIC_ERROR_FILE ("" when unset)
  std::string gloo_ifname;       // GLOO_SOCKET_IFNAME ("" when unset)
  // VLMTRAIN_SHM_COMM (default off; 1/true/on turns it on): CPU jobs whose ranks share a host
  // exchange through shared memory instead of Gloo's TCP (sharding/dist/shm_channel.h). Off
  // by default, so that a run uses c10d's Gloo as every multi-host and GPU run does.
  bool shm_comm = false;

  // Prefix of every store key: "/worker/attempt_<restart_count>" under the agent store,
  // "" otherwise.
  std::string store_prefix() const;
  std::string describe() const;  // one line for logs
};

// Parses the launcher's variables. Throws vlm::Error for partial or inconsistent settings
// (e.g. RANK without WORLD_SIZE, RANK >= WORLD_SIZE, non-numeric values, a port out of
// range, no master address for a multi-process job).
DistEnv detect_dist_env(const EnvMap& env);

// First host of a Slurm compressed host list: "gpu[003-005,9],cpu1" -> "gpu003".
std::string first_slurm_host(const std::string& nodelist);

// Expands Slurm's "2(x3),1" task-per-node list and returns the entry for `node`.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

}  // namespace vlm::sharding
