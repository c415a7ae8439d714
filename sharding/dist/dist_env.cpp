// DistEnv (see dist_env.h).
#include "sharding/dist/dist_env.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "vlm/runtime/check.h"

extern char** environ;

namespace vlm::sharding {

EnvMap process_env() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::kSingle: return "single";
    case Launcher::kTorchrun: return "torchrun";
    case Launcher::kSlurm: return "slurm";
  }
  return "?";
}

namespace {

const std::string* find(const EnvMap& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? nullptr : &it->second;
}

// A non-negative decimal integer, or an Error naming the variable.
int parse_int(const std::string& key, const std::string& value) {
  VLM_CHECK(!value.empty() && value.size() <= 9 &&
                value.find_first_not_of("0123456789") == std::string::npos,
            "environment variable ", key, ": expected a non-negative integer, got '", value,
            "' (hint: check the launcher's settings)");
  return std::stoi(value);
}

int require_int(const EnvMap& env, const std::string& key, const char* launcher) {
  const std::string* v = find(env, key);
  VLM_CHECK(v != nullptr, launcher, " environment is incomplete: ", key,
            " is not set (hint: launch with ", launcher,
            ", or unset the partial variables to run as a single process)");
  return parse_int(key, *v);
}

int optional_int(const EnvMap& env, const std::string& key, int fallback) {
  const std::string* v = find(env, key);
  return v == nullptr ? fallback : parse_int(key, *v);
}

void check_ranks(const DistEnv& d, const char* rank_var, const char* world_var,
                 const char* local_var, const char* local_world_var) {
  VLM_CHECK(d.world_size >= 1, world_var, ": expected >= 1, got ", d.world_size);
  VLM_CHECK(d.rank < d.world_size, rank_var, " must be < ", world_var, ": got ", rank_var,
            "=", d.rank, ", ", world_var, "=", d.world_size,
            " (hint: the launcher's variables disagree)");
  VLM_CHECK(d.local_world_size >= 1 && d.local_world_size <= d.world_size, local_world_var,
            ": expected 1..", d.world_size, " (", world_var, "), got ", d.local_world_size);
  VLM_CHECK(d.local_rank < d.local_world_size, local_var, " must be < ", local_world_var,
            ": got ", local_var, "=", d.local_rank, ", ", local_world_var, "=",
            d.local_world_size);
}

void parse_master(const EnvMap& env, DistEnv& d, const std::string& fallback_addr,
                  int fallback_port) {
  const std::string* addr = find(env, "MASTER_ADDR");
  d.master_addr = addr != nullptr ? *addr : fallback_addr;
  const std::string* port = find(env, "MASTER_PORT");
  d.master_port = port != nullptr ? parse_int("MASTER_PORT", *port) : fallback_port;
  if (d.world_size > 1) {
    VLM_CHECK(!d.master_addr.empty(), launcher_name(d.launcher),
              " job with world size ", d.world_size,
              " has no master address: MASTER_ADDR is not set",
              d.launcher == Launcher::kSlurm ? " and SLURM_JOB_NODELIST is empty" : "",
              " (hint: export MASTER_ADDR=<host of rank 0>)");
    VLM_CHECK(d.master_port >= 1 && d.master_port <= 65535,
              "MASTER_PORT: expected 1..65535, got ", d.master_port);
  }
}

std::string lowercase(const std::string& v) {
  std::string s;
  for (char c : v) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool truthy(const std::string* v) {
  if (v == nullptr) return false;
  const std::string s = lowercase(*v);
  return s == "true" || s == "1" || s == "yes";
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // Hosts are separated by commas outside brackets; a host may carry one or more
  // bracketed ranges: "n[01-04,07]x[1-2]" -> first host "n01x1".
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  std::string host;
  size_t i = 0;
  while (i < first.size()) {
    if (first[i] != '[') {
      host += first[i++];
      continue;
    }
    size_t close = first.find(']', i);
    VLM_CHECK(close != std::string::npos, "SLURM_JOB_NODELIST: unbalanced '[' in '", nodelist,
              "'");
    std::string range = first.substr(i + 1, close - i - 1);
    range = range.substr(0, range.find(','));  // first item of the set
    host += range.substr(0, range.find('-'));  // first value of the range (keeps zero padding)
    i = close + 1;
  }
  return host;
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  // "2(x3),1" = nodes 0..2 run 2 tasks, node 3 runs 1.
  int index = 0;
  size_t pos = 0;
  while (pos < tasks_per_node.size()) {
    size_t comma = tasks_per_node.find(',', pos);
    std::string item = tasks_per_node.substr(pos, comma == std::string::npos ? std::string::npos
                                                                             : comma - pos);
    int repeat = 1;
    size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      repeat = parse_int("SLURM_TASKS_PER_NODE", item.substr(paren + 2, item.size() - paren - 3));
      item = item.substr(0, paren);
    }
    int tasks = parse_int("SLURM_TASKS_PER_NODE", item);
    if (node < index + repeat) return tasks;
    index += repeat;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  throw Error(str("SLURM_TASKS_PER_NODE='", tasks_per_node, "' lists ", index,
                  " nodes, but SLURM_NODEID is ", node));
}

std::string DistEnv::store_prefix() const {
  return use_agent_store ? str("/worker/attempt_", restart_count) : std::string();
}

std::string DistEnv::describe() const {
  return str(launcher_name(launcher), " rank ", rank, "/", world_size, " local ", local_rank,
             "/", local_world_size, " node ", node_rank,
             world_size > 1 ? str(" master ", master_addr, ":", master_port) : std::string(),
             use_agent_store ? str(" agent store ", store_prefix()) : std::string());
}

DistEnv detect_dist_env(const EnvMap& env) {
  DistEnv d;
  if (const std::string* ifname = find(env, "GLOO_SOCKET_IFNAME")) d.gloo_ifname = *ifname;
  if (const std::string* ef = find(env, "TORCHELASTIC_ERROR_FILE")) d.error_file = *ef;
  if (const std::string* shm = find(env, "VLMTRAIN_SHM_COMM")) {
    const std::string v = lowercase(*shm);
    const bool on = truthy(shm) || v == "on";
    VLM_CHECK(on || v == "0" || v == "false" || v == "off" || v == "no",
              "VLMTRAIN_SHM_COMM: expected 0 or 1 (off / on), got '", *shm, "'");
    d.shm_comm = on;
  }

  const bool any_torchrun = find(env, "RANK") || find(env, "WORLD_SIZE") ||
                            find(env, "LOCAL_RANK") || find(env, "LOCAL_WORLD_SIZE");
  const bool any_slurm = find(env, "SLURM_PROCID") || find(env, "SLURM_NTASKS");
  if (any_torchrun) {
    d.launcher = Launcher::kTorchrun;
    d.rank = require_int(env, "RANK", "torchrun");
    d.world_size = require_int(env, "WORLD_SIZE", "torchrun");
    d.local_rank = optional_int(env, "LOCAL_RANK", d.world_size == 1 ? 0 : -1);
    VLM_CHECK(d.local_rank >= 0, "torchrun environment is incomplete: LOCAL_RANK is not set",
              " (hint: launch with torchrun, or set LOCAL_RANK and LOCAL_WORLD_SIZE)");
    d.local_world_size = optional_int(env, "LOCAL_WORLD_SIZE", d.world_size);
    d.node_rank = optional_int(env, "GROUP_RANK", d.rank / d.local_world_size);
    check_ranks(d, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    d.use_agent_store = truthy(find(env, "TORCHELASTIC_USE_AGENT_STORE"));
    d.restart_count = optional_int(env, "TORCHELASTIC_RESTART_COUNT", 0);
    if (d.world_size > 1 || d.use_agent_store) {
      VLM_CHECK(find(env, "MASTER_ADDR") && find(env, "MASTER_PORT"),
                "torchrun environment is incomplete: RANK/WORLD_SIZE are set but ",
                find(env, "MASTER_ADDR") ? "MASTER_PORT" : "MASTER_ADDR",
                " is not (hint: export MASTER_ADDR and MASTER_PORT, or launch with torchrun)");
    }
    parse_master(env, d, "", 0);
    if (d.use_agent_store)
      VLM_CHECK(d.master_port >= 1 && d.master_port <= 65535,
                "MASTER_PORT: expected 1..65535, got ", d.master_port);
    return d;
  }
  if (any_slurm) {
    d.launcher = Launcher::kSlurm;
    d.rank = require_int(env, "SLURM_PROCID", "slurm");
    d.world_size = require_int(env, "SLURM_NTASKS", "slurm");
    d.local_rank = optional_int(env, "SLURM_LOCALID", 0);
    d.node_rank = optional_int(env, "SLURM_NODEID", 0);
    if (const std::string* per = find(env, "SLURM_NTASKS_PER_NODE")) {
      d.local_world_size = parse_int("SLURM_NTASKS_PER_NODE", *per);
    } else if (const std::string* tpn = find(env, "SLURM_TASKS_PER_NODE")) {
      d.local_world_size = slurm_tasks_on_node(*tpn, d.node_rank);
    } else {
      const int nodes = optional_int(env, "SLURM_NNODES", 1);
      VLM_CHECK(nodes == 1, "slurm environment is incomplete: SLURM_NNODES=", nodes,
                " but neither SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE is set",
                " (hint: run the workers with srun)");
      d.local_world_size = d.world_size;
    }
    check_ranks(d, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
    std::string host;
    if (const std::string* nl = find(env, "SLURM_JOB_NODELIST")) host = first_slurm_host(*nl);
    else if (const std::string* nl2 = find(env, "SLURM_NODELIST")) host = first_slurm_host(*nl2);
    parse_master(env, d, host, 29500);
    return d;
  }
  return d;  // single process
}

}  // namespace vlm::sharding
