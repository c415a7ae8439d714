#include "sharding/dist/parallel_dims.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL  // defined by TorchConfig for LibTorch builds with NCCL (the PyPI wheel)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>

#include <nlohmann/json.hpp>

#include "sharding/dist/comm.h"
#include "sharding/dist/device_context.h"
#include "sharding/dist/process_group.h"
#include "sharding/dist/shm_channel.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kNone: return "none";
    case Backend::kGloo: return "gloo";
    case Backend::kNccl: return "nccl";
  }
  return "?";
}

namespace {
// A comm of one rank (every op is local): world 1, or a mesh group of size 1.
std::shared_ptr<Comm> local_comm(const ParallelOptions& opts) {
  return std::make_shared<Comm>(c10::intrusive_ptr<c10d::Backend>(), 0, 1, Backend::kNone, opts.timeout);
}
}  // namespace

// init(), step by step. Each step sets the ParallelDims fields it names; the order of the
// steps is the order in which every rank creates its groups (which must match across ranks).
struct ParallelDims::Init {
  ParallelDims& p;
  const DistEnv& env;
  const ParallelOptions& opts;
  std::string who;    // "rank r/N (launcher)", for messages
  std::string where;  // MASTER_ADDR:MASTER_PORT
  c10::intrusive_ptr<c10d::Store> store;

  Init(ParallelDims& dims, const DistEnv& e, const ParallelOptions& o)
      : p(dims), env(e), opts(o),
        who(str("rank ", e.rank, "/", e.world_size, " (", launcher_name(e.launcher), ")")),
        where(str(e.master_addr, ":", e.master_port)) {}

  // The options' device and backend checked; this rank's device (CUDA: LOCAL_RANK's GPU)
  // and its context, which makes it the thread's current device.
  bool pick_device() {
    VLM_CHECK(opts.device == "auto" || opts.device == "cpu" || opts.device == "cuda",
              "device: expected auto, cpu or cuda, got '", opts.device, "'");
    VLM_CHECK(opts.backend == "auto" || opts.backend == "gloo" || opts.backend == "nccl",
              "backend: expected auto, gloo or nccl, got '", opts.backend, "'");
    const bool cuda = opts.device == "cuda" || (opts.device == "auto" && torch::cuda::is_available());
    if (cuda) {
      VLM_CHECK(torch::cuda::is_available(), "device = cuda, but this LibTorch sees no CUDA device",
                " (hint: use device = \"cpu\" or a CUDA build of LibTorch)");
      const int gpus = static_cast<int>(torch::cuda::device_count());
      VLM_CHECK(env.local_rank < gpus || opts.backend == "gloo", "LOCAL_RANK ", env.local_rank,
                " has no GPU: this node has ", gpus,
                " (hint: --nproc_per_node must not exceed the GPU count; dist.backend = \"gloo\" lets ranks share one)");
      p.device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank % gpus));
    }
    p.device_context_ = std::make_shared<DeviceContext>(p.device_);  // sets this thread's device
    return cuda;
  }

  // The mesh's shape from the options (dp_shard 0: the ranks of one node).
  void mesh_shape() {
    p.mesh_ = opts.mesh;
    p.dp_shard_ = env.world_size;
    if (!opts.mesh) return;
    p.dp_shard_ = opts.dp_shard > 0 ? opts.dp_shard : env.local_world_size;
    VLM_CHECK(opts.dp_shard >= 0, "dist.dp_shard: expected 0 (the ranks of one node) or a positive rank count, got ",
              opts.dp_shard);
    VLM_CHECK(p.dp_shard_ <= env.world_size && env.world_size % p.dp_shard_ == 0, "dist.dp_shard = ", p.dp_shard_,
              opts.dp_shard > 0 ? "" : " (LOCAL_WORLD_SIZE)", " does not divide the world size ", env.world_size,
              " (hint: hybrid_shard shards within groups of dp_shard ranks and replicates across world / dp_shard "
              "of them; pick a divisor of the world size, usually the GPUs per node)");
  }

  // World 1: every comm is local.
  void local_comms() {
    p.comm_ = local_comm(opts);
    p.control_ = local_comm(opts);
    p.control_->set_plane("control", p.comm_.get());
    p.comm_->set_plane("data", p.control_.get());
    p.lanes_[0] = p.comm_;
    for (int l = 1; l < kNumLanes; ++l) {
      p.lanes_[l] = local_comm(opts);
      p.lanes_[l]->set_plane(str("data/", lane_name(static_cast<Lane>(l))), p.control_.get());
    }
    p.shard_lanes_ = {p.lanes_[static_cast<int>(Lane::kGather)], p.lanes_[static_cast<int>(Lane::kReduce)]};
    p.replicate_ = local_comm(opts);
    p.ep_comm_ = local_comm(opts);
    p.expert_replicate_ = local_comm(opts);
    p.cp_comm_ = local_comm(opts);
    p.tp_comm_ = local_comm(opts);
    p.pp_prev_ = local_comm(opts);
    p.pp_next_ = local_comm(opts);
    p.pp_tie_ = local_comm(opts);
  }

  // The expert-parallel degree from the options.
  void ep_shape() {
    p.ep_ = degree(opts.ep, "ep", "expert parallelism splits the experts within groups of ep consecutive ranks and "
                                  "replicates them across world / ep groups");
  }

  // A parallel degree dist.<key> that must divide the world size (else why, with `what`).
  int degree(int value, const char* key, const char* what) const {
    VLM_CHECK(value >= 1 && env.world_size % value == 0, "dist.", key, " = ", value, " does not divide the world size ",
              env.world_size, " (hint: ", what, "; pick a divisor of the world size, 1 for none)");
    return value;
  }

  // The context-parallel degree from the options.
  void cp_shape() {
    p.cp_ = degree(opts.cp, "cp", "context parallelism splits each sequence within groups of cp consecutive ranks");
    VLM_CHECK(opts.cp == 1 || opts.ep == 1, "dist.cp = ", opts.cp, " with dist.ep = ", opts.ep,
              ": context and expert parallelism together are not built yet (hint: one of them 1)");
  }

  // The tensor-parallel degree from the options.
  void tp_shape() {
    p.tp_ = degree(opts.tp, "tp", "tensor parallelism splits each layer within groups of tp consecutive ranks, "
                                  "usually the GPUs of one node");
    VLM_CHECK(opts.tp == 1 || (opts.cp == 1 && opts.ep == 1 && !opts.mesh), "dist.tp = ", opts.tp,
              " with dist.cp = ", opts.cp, ", dist.ep = ", opts.ep, opts.mesh ? " and a hybrid_shard mesh" : "",
              ": tensor parallelism with context, expert or hybrid-sharded data parallelism is not built yet "
              "(hint: tp with ddp / fsdp over the world / tp data-parallel ranks)");
  }

  // The pipeline-parallel degree from the options (the outermost dimension: tp divides a stage).
  void pp_shape() {
    p.pp_ = degree(opts.pp, "pp", "pipeline parallelism splits the decoder layers into pp stages of world / pp ranks");
    VLM_CHECK(opts.pp == 1 || (opts.cp == 1 && opts.ep == 1 && !opts.mesh), "dist.pp = ", opts.pp,
              " with dist.cp = ", opts.cp, ", dist.ep = ", opts.ep, opts.mesh ? " and a hybrid_shard mesh" : "",
              ": pipeline parallelism with context, expert or hybrid-sharded data parallelism is not built yet "
              "(hint: pp with tp and ddp / fsdp inside each stage)");
    VLM_CHECK((env.world_size / p.pp_) % p.tp_ == 0, "dist.tp = ", p.tp_, " does not divide a pipeline stage's ",
              env.world_size / p.pp_, " ranks (world ", env.world_size, " / dist.pp ", p.pp_,
              ") (hint: world = pp x dp x tp)");
  }

  // The rendezvous store: rank 0 hosts it, or every rank joins the torchrun agent's (under
  // the attempt's prefix).
  void connect_store() {
    const bool server = !env.use_agent_store && env.rank == 0;
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(env.master_port);
    so.isServer = server;
    so.waitWorkers = false;
    so.timeout = opts.timeout;
    store = wrap(server ? str(who, ": cannot host the rendezvous store on port ", env.master_port)
                        : str(who, ": cannot reach the rendezvous store at ", where, " within ",
                              opts.timeout.count() / 1000.0, " s"),
                 server ? "the port is probably in use: pick another MASTER_PORT"
                        : (env.use_agent_store ? "the torchrun agent's store is not listening there"
                                               : "is rank 0 running, and MASTER_ADDR/MASTER_PORT the same on all ranks?"),
                 [&] { return c10::make_intrusive<c10d::TCPStore>(env.master_addr, so); });
    if (env.use_agent_store) store = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix(), store);
    store->setTimeout(opts.timeout);
    p.store_ = store;
  }

  // The data plane's world group: NCCL on CUDA (unless dist.backend = "gloo"), else Gloo.
  void world_group(bool cuda) {
    VLM_CHECK(cuda || opts.backend != "nccl", "dist.backend = \"nccl\" needs the CUDA device, but this rank runs on ",
              "the CPU (hint: dist.device = \"cuda\", or dist.backend = \"auto\")");
    if (cuda && opts.backend != "gloo") {
#ifdef USE_C10D_NCCL
      p.group_ = make_nccl_group(env, opts, store, who, env.rank, env.world_size);
      p.backend_ = Backend::kNccl;
#else
      throw Error(str("device is CUDA but the LibTorch this vlmtrain was built against has no "
                      "NCCL (hint: build against the PyPI wheel torch==2.11.0, or use device = "
                      "\"cpu\")"));
#endif
    } else {
      p.group_ = make_gloo_group(env, opts, store, who, where, env.rank, env.world_size);
      p.backend_ = Backend::kGloo;
    }
    p.comm_ = std::make_shared<Comm>(p.group_, env.rank, env.world_size, p.backend_, opts.timeout);
    p.comm_->set_store(store);
  }

  // Small host-side agreement (token counts, statistics, votes, fingerprints, eval gathers,
  // checkpoint barriers) on CPU tensors, over its own Gloo group: NCCL takes CUDA tensors
  // only, and a separate group keeps these ops out of the data plane's order.
  void control_plane() {
    auto control_store = c10::make_intrusive<c10d::PrefixStore>("control", store);
    p.control_group_ = make_gloo_group(env, opts, control_store, who, where, env.rank, env.world_size);
    p.control_ = std::make_shared<Comm>(p.control_group_, env.rank, env.world_size, Backend::kGloo, opts.timeout);
    p.control_->set_store(control_store);
    p.control_->set_plane("control", p.comm_.get());
    p.comm_->set_plane("data", p.control_.get());
  }

  // The shared-memory channel (CPU jobs on one host, opt-in) for a Gloo comm, or the reason
  // it is off.
  void attach_shm(Comm& c, const c10::intrusive_ptr<c10d::Store>& st, int rank, int size) {
    std::string why_not = "opt in with VLMTRAIN_SHM_COMM=1";
    std::shared_ptr<ShmChannel> shm;
    if (env.shm_comm) {
      shm = wrap(str(who, ": shared-memory set-up through ", where),
                 "unset VLMTRAIN_SHM_COMM (or set it to 0) to use Gloo's TCP only",
                 [&] { return ShmChannel::create(st, rank, size, opts.timeout, &why_not); });
    }
    c.set_shm(shm, shm ? std::string() : "shared memory off: " + why_not);
  }

  // A data-plane comm over a group of its own: `size` ranks (this one `rank` among them)
  // meeting under `prefix` in the store, with the main group's backend, and on Gloo the
  // shared-memory channel when opted in. Size 1: local, no group.
  std::shared_ptr<Comm> make_comm(const std::string& prefix, const std::string& plane, int rank, int size,
                                  c10::intrusive_ptr<c10d::Backend>* group) {
    if (size == 1) {
      auto c = local_comm(opts);
      c->set_plane(plane, p.control_.get());
      return c;
    }
    auto sub_store = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    *group = p.backend_ == Backend::kNccl ? make_nccl_group(env, opts, sub_store, who, rank, size)
                                          : make_gloo_group(env, opts, sub_store, who, where, rank, size);
    auto c = std::make_shared<Comm>(*group, rank, size, p.backend_, opts.timeout);
    c->set_store(sub_store);
    c->set_plane(plane, p.control_.get());
    if (p.backend_ == Backend::kGloo) attach_shm(*c, sub_store, rank, size);
    return c;
  }

  // One group per lane (the header comment), each with the main group's transport.
  void lanes() {
    agree(p.tp_, "tp", "tensor");
    agree(p.pp_, "pp", "pipeline");
    if (p.tp_ > 1 || p.pp_ > 1) {  // this stage's data-parallel group of this tp rank: every tp-th rank
      const int stage = p.pp_rank(), tp_rank = p.tp_rank(), dp = p.stage_size() / p.tp_, me = p.stage_index() / p.tp_;
      c10::intrusive_ptr<c10d::Backend> g;
      p.comm_ = make_comm(str("dp/", stage, "/", tp_rank, "/main"), "data", me, dp, &g);
      p.lane_groups_[0] = g;
      for (int l = 1; l < kNumLanes; ++l) {
        const std::string name = lane_name(static_cast<Lane>(l));
        p.lanes_[l] = opts.lanes ? make_comm(str("dp/", stage, "/", tp_rank, "/", name), str("data/", name), me, dp,
                                             &p.lane_groups_[l])
                                 : p.comm_;
      }
      p.lanes_[0] = p.comm_;
      return;
    }
    if (p.backend_ == Backend::kGloo) attach_shm(*p.comm_, store, env.rank, env.world_size);
    p.lanes_[0] = p.comm_;
    for (int l = 1; l < kNumLanes; ++l) {
      const std::string name = lane_name(static_cast<Lane>(l));
      if (!opts.lanes) {
        p.lanes_[l] = p.comm_;
        continue;
      }
      p.lanes_[l] = make_comm(str("lane/", name), str("data/", name), env.rank, env.world_size, &p.lane_groups_[l]);
    }
  }

  // Every rank must derive the same mesh (dp_shard 0 follows LOCAL_WORLD_SIZE, which may
  // differ between nodes): agree on it over the control plane before any mesh group exists.
  void agree_on_mesh() {
    torch::Tensor d = torch::tensor({static_cast<double>(p.dp_shard_), -static_cast<double>(p.dp_shard_)}, torch::kFloat64);
    p.control_->all_reduce(d, ReduceOp::kMax, "agree on the mesh (dist.dp_shard)");
    VLM_CHECK(d[0].item<double>() == -d[1].item<double>(), who, ": the ranks derive different mesh shapes: dp_shard is ",
              p.dp_shard_, " here, between ", -d[1].item<double>(), " and ", d[0].item<double>(), " over the ranks",
              opts.dp_shard > 0 ? "" : " (dist.dp_shard = 0 follows LOCAL_WORLD_SIZE, which differs between nodes)",
              " (hint: set dist.dp_shard explicitly, the same on every node)");
  }

  // hybrid_shard's groups: rank = replica * dp_shard + shard_rank; the shard groups are runs
  // of consecutive ranks (a node's under torchrun / Slurm when dp_shard = LOCAL_WORLD_SIZE),
  // the replicate groups take every dp_shard-th rank. Without a mesh the "shard group" is
  // the world and there is no replica.
  void mesh_groups() {
    p.shard_lanes_ = {p.lanes_[static_cast<int>(Lane::kGather)], p.lanes_[static_cast<int>(Lane::kReduce)]};
    p.replicate_ = local_comm(opts);
    p.replicate_->set_plane("data/replicate", p.control_.get());
    if (!opts.mesh) return;
    agree_on_mesh();
    const int replica = p.replica(), shard_rank = p.shard_rank();
    const int dp_shard = p.dp_shard_, dp_replicate = p.dp_replicate();
    for (int k = 0; k < 2; ++k) {
      const Lane lane = k == 0 ? Lane::kGather : Lane::kReduce;
      if (dp_shard == env.world_size) {  // one shard group: the world's lanes
        p.shard_lanes_[k] = p.lanes_[static_cast<int>(lane)];
      } else {
        c10::intrusive_ptr<c10d::Backend> g;
        p.shard_lanes_[k] = make_comm(str("mesh/shard", replica, "/", lane_name(lane)),
                                      str("data/shard", replica, "/", lane_name(lane)), shard_rank, dp_shard, &g);
        if (g) p.mesh_groups_.push_back(g);
      }
    }
    c10::intrusive_ptr<c10d::Backend> g;
    p.replicate_ = make_comm(str("mesh/replicate", shard_rank), str("data/replicate", shard_rank), replica,
                             dp_replicate, &g);
    if (g) p.mesh_groups_.push_back(g);
  }

  // Every rank has the same degree `value` of dist.<key> (one all-reduce of (v, -v) with max
  // on the control plane), else every rank stops naming the range: a mismatch would otherwise
  // hang in the groups' rendezvous.
  void agree(int value, const char* key, const char* kind) {
    torch::Tensor d = torch::tensor({static_cast<double>(value), -static_cast<double>(value)}, torch::kFloat64);
    p.control_->all_reduce(d, ReduceOp::kMax, str("agree on ", kind, " parallelism (dist.", key, ")"));
    VLM_CHECK(d[0].item<double>() == -d[1].item<double>(), who, ": the ranks ask for different ", kind,
              "-parallel degrees: ", key, " is ", value, " here, between ", -d[1].item<double>(), " and ",
              d[0].item<double>(), " over the ranks (hint: every rank must run the same recipe)");
  }

  // Expert parallelism's groups (ParallelOptions::ep), after the mesh's: the EP groups are
  // runs of ep consecutive ranks ("ep<g>"), the expert-replicate groups take every ep-th rank
  // ("expert_replicate<j>"). The ranks agree on ep over the control plane first (a mismatch
  // would otherwise hang in the groups' rendezvous). ep 1: both local.
  void ep_groups() {
    p.ep_comm_ = local_comm(opts);
    p.ep_comm_->set_plane("data/ep", p.control_.get());
    p.expert_replicate_ = local_comm(opts);
    p.expert_replicate_->set_plane("data/expert_replicate", p.control_.get());
    agree(p.ep_, "ep", "expert");
    if (p.ep_ == 1) return;
    const int group = p.ep_group(), ep_rank = p.ep_rank();
    c10::intrusive_ptr<c10d::Backend> g;
    p.ep_comm_ = make_comm(str("ep/", group), str("data/ep", group), ep_rank, p.ep_, &g);
    if (g) p.mesh_groups_.push_back(g);
    c10::intrusive_ptr<c10d::Backend> r;
    p.expert_replicate_ = make_comm(str("ep_replicate/", ep_rank), str("data/expert_replicate", ep_rank), group,
                                    env.world_size / p.ep_, &r);
    if (r) p.mesh_groups_.push_back(r);
  }

  // Context parallelism's groups (ParallelOptions::cp), after the expert-parallel ones: runs
  // of cp consecutive ranks ("cp<g>"), agreed on over the control plane first. cp 1: local.
  void cp_groups() {
    p.cp_comm_ = local_comm(opts);
    p.cp_comm_->set_plane("data/cp", p.control_.get());
    agree(p.cp_, "cp", "context");
    if (p.cp_ == 1) return;
    const int group = p.dp_rank();
    c10::intrusive_ptr<c10d::Backend> g;
    p.cp_comm_ = make_comm(str("cp/", group), str("data/cp", group), p.cp_rank(), p.cp_, &g);
    if (g) p.mesh_groups_.push_back(g);
  }

  // Pipeline parallelism's links (ParallelOptions::pp): per stage boundary and stage index a
  // 2-rank group ("pp/<s>/<i>": stage s's rank is rank 0), made previous link first (so the
  // chain of rendezvous completes from stage 0), then the tie group of stage 0 and the last
  // stage ("pp_tie/<i>"). pp 1: local. (The ranks agreed on pp in lanes().)
  void pp_groups() {
    p.pp_prev_ = local_comm(opts);
    p.pp_prev_->set_plane("data/pp_prev", p.control_.get());
    p.pp_next_ = local_comm(opts);
    p.pp_next_->set_plane("data/pp_next", p.control_.get());
    p.pp_tie_ = local_comm(opts);
    p.pp_tie_->set_plane("data/pp_tie", p.control_.get());
    if (p.pp_ == 1) return;
    const int s = p.pp_rank(), i = p.stage_index(), last = p.pp_ - 1;
    c10::intrusive_ptr<c10d::Backend> g;
    if (s > 0) p.pp_prev_ = make_comm(str("pp/", s - 1, "/", i), str("data/pp", s - 1, "-", s, "/", i), 1, 2, &g);
    if (g) p.mesh_groups_.push_back(g);
    g.reset();
    if (s < last) p.pp_next_ = make_comm(str("pp/", s, "/", i), str("data/pp", s, "-", s + 1, "/", i), 0, 2, &g);
    if (g) p.mesh_groups_.push_back(g);
    g.reset();
    if (s == 0 || s == last) p.pp_tie_ = make_comm(str("pp_tie/", i), str("data/pp_tie/", i), s == 0 ? 0 : 1, 2, &g);
    if (g) p.mesh_groups_.push_back(g);
  }

  // Tensor parallelism's groups (ParallelOptions::tp): runs of tp consecutive ranks ("tp<g>").
  // tp 1: local. (The ranks agreed on tp in lanes().)
  void tp_groups() {
    p.tp_comm_ = local_comm(opts);
    p.tp_comm_->set_plane("data/tp", p.control_.get());
    if (p.tp_ == 1) return;
    const int group = env.rank / p.tp_;  // unique over the stages too
    c10::intrusive_ptr<c10d::Backend> g;
    p.tp_comm_ = make_comm(str("tp/", group), str("data/tp", group), p.tp_rank(), p.tp_, &g);
    if (g) p.mesh_groups_.push_back(g);
  }

  // Every communicator created now, not at its first use: NCCL makes a group's communicator
  // lazily at its first collective, several of which would otherwise come inside backward on
  // the autograd thread, where a rank that reaches them differently waits for the watchdog.
  // Here every rank runs one all-reduce of a 1-element device tensor on each data-plane comm
  // (then the control plane), in data_comms()' fixed order
  // (lanes, shard lanes, replicate, EP, expert replicate, CP), waits for it and synchronises the
  // device; the sum is checked and the time recorded.
  void warm_up_comms() {
    std::vector<Comm*> comms = p.data_comms();
    comms.push_back(p.control_.get());
    for (Comm* c : comms) {
      if (c->world_size() == 1) continue;
      const auto t0 = std::chrono::steady_clock::now();
      const torch::Device dev = c == p.control_.get() ? torch::Device(torch::kCPU) : p.device_;
      torch::Tensor one = torch::ones({1}, torch::TensorOptions().device(dev).dtype(torch::kFloat32));
      c->all_reduce(one, ReduceOp::kSum, str("start-up: create the ", c->plane(), " communicator"));
      p.device_context_->synchronize();
      const double got = one.cpu().item<double>();
      VLM_CHECK(got == c->world_size(), who, ": the start-up all-reduce on ", c->plane(), " gave ", got, ", expected ",
                c->world_size(), " (hint: a rank joined the wrong group; check MASTER_ADDR / MASTER_PORT)");
      p.warm_ups_.push_back({c->plane(), c->world_size(),
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
    }
    for (Comm* c : comms) c->reset_stats();  // the counters start with the training's traffic
  }
};

ParallelDims ParallelDims::init(const DistEnv& env, const ParallelOptions& opts) {
  ParallelDims p;
  p.env_ = env;
  p.timeout_ = opts.timeout;
  Init in(p, env, opts);
  const bool cuda = in.pick_device();
  in.mesh_shape();
  in.ep_shape();
  in.cp_shape();
  in.tp_shape();
  in.pp_shape();
  if (env.world_size == 1) {
    in.local_comms();
    return p;
  }
  in.connect_store();
  in.world_group(cuda);
  in.control_plane();
  in.lanes();
  in.mesh_groups();
  in.ep_groups();
  in.cp_groups();
  in.tp_groups();
  in.pp_groups();
  in.warm_up_comms();
  if (p.backend_ == Backend::kNccl) p.start_watchdog();
  return p;
}

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::kMain: return "main";
    case Lane::kGather: return "fsdp-gather";
    case Lane::kReduce: return "fsdp-reduce";
    case Lane::kDdp: return "ddp";
  }
  return "?";
}

std::vector<Comm*> ParallelDims::data_comms() const {
  std::vector<Comm*> out;
  auto add = [&out](const std::shared_ptr<Comm>& c) {
    if (c && std::find(out.begin(), out.end(), c.get()) == out.end()) out.push_back(c.get());
  };
  for (const auto& c : lanes_) add(c);  // lanes off: the main comm counted once
  for (const auto& c : shard_lanes_) add(c);
  add(replicate_);
  add(ep_comm_);
  add(expert_replicate_);
  add(cp_comm_);
  add(tp_comm_);
  add(pp_prev_);  // previous link first: the warm-up's chain of pairs completes from stage 0
  add(pp_next_);
  add(pp_tie_);
  return out;
}

CommStats ParallelDims::data_stats() const {
  CommStats sum;
  for (const Comm* c : data_comms()) {
    for (int k = 0; k < kNumOpKinds; ++k) {
      const OpStats& o = c->stats().ops[k];
      sum.ops[k].calls += o.calls;
      sum.ops[k].logical_bytes += o.logical_bytes;
      sum.ops[k].wire_bytes += o.wire_bytes;
      sum.ops[k].wait_s += o.wait_s;
    }
  }
  return sum;
}

void ParallelDims::reset_data_stats() const {
  for (Comm* c : data_comms()) c->reset_stats();
}

ParallelDims ParallelDims::from_environment(const ParallelOptions& opts) {
  return init(detect_dist_env(process_env()), opts);
}

namespace {
bool write_error_json(const std::string& path, const std::string& message) {
  if (path.empty()) return false;
  nlohmann::json j = {{"message", message}, {"timestamp", static_cast<int64_t>(std::time(nullptr))}};
  std::ofstream f(path, std::ios::trunc);
  if (!f) return false;
  f << j.dump() << "\n";
  return static_cast<bool>(f);
}
}  // namespace

bool ParallelDims::write_error_file(const std::string& message) const {
  return write_error_json(env_.error_file, message);
}

void ParallelDims::start_watchdog() {
  if (!distributed()) return;
  std::vector<c10::intrusive_ptr<c10d::Backend>> groups = {group_};
  for (const auto& g : lane_groups_)
    if (g) groups.push_back(g);
  for (const auto& g : mesh_groups_) groups.push_back(g);
  for (Comm* cp : data_comms()) {
    Comm& c = *cp;
    if (c.world_size() == 1 || c.watchdog_running()) continue;
    // Runs on the watchdog's thread while the main thread may be blocked in the driver: no
    // exception can reach main, so the process ends here.
    c.start_watchdog([error_file = env_.error_file, groups, rank = env_.rank](const std::string& report) {
      std::fprintf(stderr, "vlmtrain: error (rank %d): %s\n", rank, report.c_str());
      std::fflush(stderr);
      write_error_json(error_file, report);
      for (const auto& group : groups) {
        try {
          group->abort();  // NCCL: frees the communicators; kernels waiting on peers return
        } catch (...) {
        }
      }
      std::_Exit(1);
    });
  }
}

}  // namespace vlm::sharding
