// ParallelDims: who am I in the job, and the store + process group that connect the ranks.
//
// Two steps, kept apart so the first is testable without processes:
//
//   DistEnv env = detect_dist_env(process_env());       // pure: env map -> facts (or Error)
//   ParallelDims dims = ParallelDims::init(env, opts);   // connects: store, process group
//
// Launchers and their variables: sharding/dist/dist_env.h.
//
// Device: CUDA device LOCAL_RANK (made the calling thread's current device) when the
// device is CUDA, else CPU.
// Planes: the data plane (comm()) is NCCL when the device is CUDA, Gloo on CPU; the control
// plane (control()) is a second group, Gloo on every backend, for CPU scalars.
// Lanes: the data plane is split into one process group per stream of collectives whose
// interleaving autograd decides (Lane below): FSDP all-gathers, FSDP reduce-scatters and
// DDP bucket all-reduces each have their own group, so the order of one lane's ops against
// another's may differ between ranks (an image on one rank only, another autograd schedule)
// without mismatching collectives; within a lane the engines issue in a fixed order (unit
// order, bucket order). On NCCL each group is its own communicator with its own stream, so
// an all-gather (prefetch) and a reduce-scatter run concurrently with each other and with
// compute; work.wait() orders the compute stream after the op (an event wait, no host
// sync), and the group's Work keeps its tensors alive until then.
// Backend: NCCL when the device is CUDA (device index = LOCAL_RANK), Gloo on CPU. Gloo binds to GLOO_SOCKET_IFNAME
// when set, to 127.0.0.1 when the master is a loopback address, else to the local address
// of the route to the master (so a hostname that resolves to 127.0.1.1 cannot strand it).
// The rendezvous TCPStore (rank 0) listens on all interfaces.
#pragma once
#include <torch/torch.h>

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "sharding/dist/dist_env.h"

namespace vlm::sharding {

class Comm;
class DeviceContext;
struct CommStats;

enum class Backend { kNone, kGloo, kNccl };
const char* backend_name(Backend b);

// Lanes of the data plane (see the header comment).
enum class Lane {
  kMain = 0,  // everything else: the start-up broadcast, ZeRO-1 gathers, tests
  kGather,    // FSDP all-gathers (forward, prefetch, backward re-gather)
  kReduce,    // FSDP reduce-scatters
  kDdp,       // DDP bucket all-reduces
};
constexpr int kNumLanes = 4;
const char* lane_name(Lane lane);  // "main", "fsdp-gather", "fsdp-reduce", "ddp"

struct ParallelOptions {
  // Timeout for store rendezvous and every collective (recipe: dist.timeout_s).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // "auto" (CUDA when available, else CPU), "cpu" or "cuda".
  std::string device = "auto";
  // Data plane: "auto" (NCCL on CUDA, Gloo on CPU), "gloo" or "nccl". Gloo on CUDA stages
  // through host copies and lets ranks share a GPU (device LOCAL_RANK mod the GPU count),
  // which NCCL refuses: what tests of several ranks on one GPU use.
  std::string backend = "auto";
  // One process group per lane (true), or every lane on the main group (false: one
  // communicator; the order of FSDP and DDP ops is then set by autograd's schedule, which
  // can differ between ranks and mismatch collectives; for comparison only).
  bool lanes = true;
  // The data-parallel mesh dp_replicate x dp_shard for hybrid_shard units (recipe: set when a
  // rule uses hybrid_shard): FSDP within each shard group of dp_shard consecutive ranks,
  // gradients all-reduced across the dp_replicate = world / dp_shard groups. dp_shard 0: the
  // ranks of one node (LOCAL_WORLD_SIZE); it must divide the world size. Without a mesh the
  // shard group is the world and there is one replica.
  bool mesh = false;
  int dp_shard = 0;
  // Expert parallelism (recipe: dist.ep; sharding/parallel/expert_parallel.h): groups of `ep`
  // consecutive ranks split each MoE layer's experts between them (a dimension inside data
  // parallelism: it must divide the world size). 1: no expert parallelism.
  int ep = 1;
  // Context parallelism (recipe: dist.cp; sharding/parallel/context_parallel.h): groups of `cp`
  // consecutive ranks split each micro-batch's sequence between them and run the same
  // micro-batches (the data-parallel ranks are the world / cp groups). It must divide the
  // world size; not with ep > 1 yet. 1: none.
  int cp = 1;
  // Tensor parallelism (recipe: dist.tp; sharding/parallel/tensor_parallel.h): groups of `tp`
  // consecutive ranks (the innermost dimension: one node's NVLink domain) split each decoder
  // layer's heads and MLP width and the vocabulary between them and run the same
  // micro-batches. The data plane's lanes then span the data-parallel ranks only: the world /
  // tp ranks with this rank's tp_rank(). It must divide the world size; not with cp, ep or
  // the hybrid_shard mesh yet. 1: none.
  int tp = 1;
  // Pipeline parallelism (recipe: dist.pp; sharding/parallel/pipeline.h): the outermost
  // dimension. The world splits into pp stages of world / pp consecutive ranks (across nodes);
  // stage s holds a contiguous run of the decoder layers (stage 0 also the vision tower and the
  // embedding, the last one the final norm and the head) and passes activations forward and
  // gradients back to the rank with the same index inside the neighbouring stage (a 2-rank
  // group per link). Inside a stage, data and tensor parallelism as without pp. It must divide
  // the world size; not with cp, ep or the hybrid_shard mesh yet. 1: none.
  int pp = 1;
};

// The NCCL environment vlmtrain runs with, set before the first NCCL process group unless
// the user set the variable already (their value stands). Returns "NAME=value" of those set.
//   TORCH_NCCL_AVOID_RECORD_STREAMS=1: ProcessGroupNCCL keeps the tensors of an op alive until
//     its Work is waited, instead of recordStream() on the caching allocator (which holds
//     their blocks until a later event query and inflates memory). Safe here because Comm
//     waits every Work on the stream that next uses its tensors before they are reused or
//     freed (fsdp.h, ddp.h: gathers before compute, reduce-scatters before the optimizer).
std::vector<std::string> apply_nccl_env_defaults();

// Copies share the store, the group and the comm. Without the agent store, rank 0's
// process hosts the TCPStore: end a job with comm().barrier() so rank 0 does not leave (and
// take the store with it) while other ranks still use it.
class ParallelDims {
 public:
  // Connects to the other ranks: creates (or joins) the store and the process group.
  // Blocks until every rank has joined or `opts.timeout` passes (then throws, naming the
  // master address and the ranks' roles). World size 1 creates nothing.
  static ParallelDims init(const DistEnv& env, const ParallelOptions& opts = {});
  // init(detect_dist_env(process_env()), opts): what the trainer calls.
  static ParallelDims from_environment(const ParallelOptions& opts = {});

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int local_rank() const { return env_.local_rank; }
  int local_world_size() const { return env_.local_world_size; }
  int node_rank() const { return env_.node_rank; }
  bool is_main() const { return env_.rank == 0; }
  bool distributed() const { return env_.world_size > 1; }
  Backend backend() const { return backend_; }
  torch::Device device() const { return device_; }
  // The owner of this rank's device (current device, copy stream, pinned staging).
  DeviceContext& device_context() const { return *device_context_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const DistEnv& env() const { return env_; }

  // The store all ranks share (already prefixed under the agent store); null for world 1.
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  // The world process group backend; null for world 1.
  const c10::intrusive_ptr<c10d::Backend>& group() const { return group_; }

  // The data plane: the comm layer over the world group (NCCL on CUDA, Gloo or shared
  // memory on CPU) for parameters and gradients; counters and flight recorder live there.
  // comm() is the main lane; comm(lane) the lane's own group (see the header comment).
  Comm& comm() const { return *comm_; }
  Comm& comm(Lane lane) const { return *lanes_[static_cast<int>(lane)]; }
  // Mesh (ParallelOptions::mesh): rank = replica() * dp_shard() + shard_rank().
  bool has_mesh() const { return mesh_; }
  int dp_shard() const { return dp_shard_; }
  int dp_replicate() const { return env_.world_size / dp_shard_; }
  int shard_rank() const { return env_.rank % dp_shard_; }
  int replica() const { return env_.rank / dp_shard_; }
  // The shard group's lanes (kGather or kReduce; the world's lanes when dp_shard is the
  // world size) and the replicate group's comm (this rank and the ranks with the same
  // shard_rank in the other replicas; local when dp_replicate is 1), all on the data plane.
  Comm& shard_comm(Lane lane) const { return *shard_lanes_[lane == Lane::kReduce ? 1 : 0]; }
  Comm& replicate_comm() const { return *replicate_; }
  // Expert parallelism (ParallelOptions::ep): rank = ep_group() * ep() + ep_rank(). The EP
  // group (ep consecutive ranks, its own process group: the all-to-alls of the token
  // dispatch) and the expert-replicate group (the world / ep ranks with this ep_rank, which
  // hold the same experts: their gradient all-reduce). Both local (size 1) when unused.
  int ep() const { return ep_; }
  int ep_rank() const { return env_.rank % ep_; }
  int ep_group() const { return env_.rank / ep_; }
  Comm& ep_comm() const { return *ep_comm_; }
  Comm& expert_replicate_comm() const { return *expert_replicate_; }
  // Context parallelism (ParallelOptions::cp): rank = dp_rank() * cp() + cp_rank(). The cp
  // ranks of a group share their data (the sampler and step plan see dp_size() ranks) and
  // exchange q/k/v over the group's comm (its own process group); local when cp is 1.
  int cp() const { return cp_; }
  int cp_rank() const { return env_.rank % cp_; }
  int dp_rank() const { return stage_index() / (cp_ * tp_); }
  int dp_size() const { return stage_size() / (cp_ * tp_); }
  Comm& cp_comm() const { return *cp_comm_; }
  // Tensor parallelism (ParallelOptions::tp): rank = dp_rank() * tp() + tp_rank(). The tp
  // ranks of a group share their data and exchange activations over tp_comm() (its own
  // process group); the lanes (comm(lane)) are the data-parallel group of this tp_rank().
  int tp() const { return tp_; }
  int tp_rank() const { return env_.rank % tp_; }
  Comm& tp_comm() const { return *tp_comm_; }
  // Pipeline parallelism (ParallelOptions::pp): rank = pp_rank() * stage_size() +
  // stage_index(). pp_prev() / pp_next(): the 2-rank groups of this rank and the rank with the
  // same stage_index() in the previous / next stage (rank 0 of each: the earlier stage); local
  // (size 1) at the ends. pp_tie(): stage 0's rank and the last stage's (same stage_index),
  // for tied embeddings; local when pp is 1. The lanes (comm(lane)) span this stage's
  // data-parallel group.
  int pp() const { return pp_; }
  int pp_rank() const { return env_.rank / stage_size(); }
  int stage_size() const { return env_.world_size / pp_; }
  int stage_index() const { return env_.rank % stage_size(); }
  Comm& pp_prev() const { return *pp_prev_; }
  Comm& pp_next() const { return *pp_next_; }
  Comm& pp_tie() const { return *pp_tie_; }
  // The ranks that run the same micro-batches (a context- or tensor-parallel group: cp x tp
  // consecutive ranks) and the data-parallel index of this rank's group.
  int data_group_size() const { return cp_ * tp_; }
  // Every distinct data-plane comm (lanes, mesh groups, expert-, context-, tensor-parallel
  // groups, pipeline links).
  std::vector<Comm*> data_comms() const;
  // The data plane's counters summed over its comms (lanes and mesh), and their reset.
  CommStats data_stats() const;
  void reset_data_stats() const;
  // The control plane: a Gloo group of its own for small host-side agreement on CPU tensors
  // (token counts, step statistics, non-finite votes, fingerprints, eval gathers,
  // checkpoint barriers), on every backend. Each plane's errors include the other's last ops.
  Comm& control() const { return *control_; }
  // The control plane's process group; null for world 1.
  const c10::intrusive_ptr<c10d::Backend>& control_group() const { return control_group_; }

  // The communicators init() created eagerly (warm_up_comms), in the order it created them:
  // each comm's plane name and the seconds its first collective took (group creation
  // included: NCCL makes a communicator at a group's first collective).
  struct CommWarmUp {
    std::string plane;
    int size = 0;
    double seconds = 0;
  };
  const std::vector<CommWarmUp>& comm_warm_ups() const { return warm_ups_; }

  // Writes torchrun's error file ({"message": ..., "timestamp": ...}) when
  // TORCHELASTIC_ERROR_FILE is set; returns whether a file was written.
  bool write_error_file(const std::string& message) const;

  // Starts the data plane's watchdog (comm_watchdog.h) with the standard ending: the report
  // on stderr and in the error file, the process group aborted, exit code 1. init() starts
  // it on NCCL (whose wait() leaves the host running); a no-op at world 1 or when running.
  void start_watchdog();

 private:
  struct Init;  // init()'s steps (parallel_dims.cpp)
  ParallelDims() = default;
  DistEnv env_;
  Backend backend_ = Backend::kNone;
  torch::Device device_{torch::kCPU};
  std::chrono::milliseconds timeout_{0};
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> group_;
  c10::intrusive_ptr<c10d::Backend> control_group_;
  std::shared_ptr<Comm> comm_;  // == lanes_[kMain]
  std::array<std::shared_ptr<Comm>, kNumLanes> lanes_;
  std::array<c10::intrusive_ptr<c10d::Backend>, kNumLanes> lane_groups_;  // null: the main group
  std::shared_ptr<Comm> control_;
  std::shared_ptr<DeviceContext> device_context_;
  bool mesh_ = false;
  int dp_shard_ = 1;
  std::array<std::shared_ptr<Comm>, 2> shard_lanes_;  // kGather, kReduce
  std::shared_ptr<Comm> replicate_;
  int ep_ = 1;
  std::shared_ptr<Comm> ep_comm_;           // EP group: the dispatch all-to-alls
  std::shared_ptr<Comm> expert_replicate_;  // same experts: their gradient all-reduce
  int cp_ = 1;
  std::shared_ptr<Comm> cp_comm_;  // context-parallel group: the sequence exchanges
  int tp_ = 1;
  std::shared_ptr<Comm> tp_comm_;  // tensor-parallel group: the activation exchanges
  int pp_ = 1;
  std::shared_ptr<Comm> pp_prev_, pp_next_, pp_tie_;  // pipeline links (2 ranks each, or local)
  std::vector<c10::intrusive_ptr<c10d::Backend>> mesh_groups_;
  std::vector<CommWarmUp> warm_ups_;
};

}  // namespace vlm::sharding
