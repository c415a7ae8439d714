#include "sharding/dist/comm.h"

#include <sstream>
#include <thread>

#include "sharding/dist/comm_watchdog.h"
#include "sharding/dist/shm_channel.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kAllToAll: return "all_to_all";
  }
  return "?";
}

double CommStats::logical_bytes() const {
  double s = 0;
  for (const auto& o : ops) s += o.logical_bytes;
  return s;
}
double CommStats::wire_bytes() const {
  double s = 0;
  for (const auto& o : ops) s += o.wire_bytes;
  return s;
}
double CommStats::wait_s() const {
  double s = 0;
  for (const auto& o : ops) s += o.wait_s;
  return s;
}
int64_t CommStats::calls() const {
  int64_t s = 0;
  for (const auto& o : ops) s += o.calls;
  return s;
}

std::string FlightEntry::to_string() const {
  const char* st = state == State::kEntered ? "PENDING" : state == State::kCompleted ? "done" : "FAILED";
  std::ostringstream ss;
  ss << "#" << seq << " " << op_name(op) << " " << what << " [" << context << "] " << st;
  if (state != State::kEntered) ss << " " << ms << " ms";
  return ss.str();
}

namespace {

std::string describe(const torch::Tensor& t) {
  std::ostringstream ss;
  ss << t.sizes() << " " << t.scalar_type();
  return ss.str();
}

bool is_half(torch::ScalarType s) { return s == torch::kBFloat16 || s == torch::kHalf; }

void check_tensor(const torch::Tensor& t, const char* op, const char* name) {
  VLM_CHECK(t.defined(), "comm: ", op, ": ", name, " is undefined");
  VLM_CHECK(t.is_contiguous(), "comm: ", op, ": ", name, " must be contiguous, got ",
            describe(t), " with strides ", t.strides(), " (hint: pass a contiguous buffer)");
  VLM_CHECK(t.scalar_type() != torch::kBool, "comm: ", op, ": bool tensors are not supported",
            " (hint: convert to uint8)");
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return c10d::ReduceOp::SUM;  // avg = sum / N, done in the epilogue
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// Gloo's flat all-gather / reduce-scatter are slower than the ways below (sharding/dist/comm.h).
bool native_flat_ops(Backend b) { return b == Backend::kNccl; }

// A 2-byte float tensor seen as its raw bytes [2 * numel] uint8 (bit-exact for copies,
// whatever dtypes the backend accepts); others unchanged.
torch::Tensor as_bits(const torch::Tensor& t) {
  return is_half(t.scalar_type()) ? t.view(-1).view(torch::kByte) : t;
}

using WorkList = std::vector<c10::intrusive_ptr<c10d::Work>>;

// The issue step of an all-reduce of `buf` (in place), for Comm::launch.
std::function<WorkList()> allreduce_issue(c10::intrusive_ptr<c10d::Backend> group,
                                          torch::Tensor buf, ReduceOp op,
                                          std::chrono::milliseconds timeout) {
  return [group, buf, op, timeout]() mutable {
    std::vector<torch::Tensor> v{buf};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    o.timeout = timeout;
    return WorkList{group->allreduce(v, o)};
  };
}

}  // namespace

// ------------------------------------------------------------------ Work

void Work::wait() {
  if (done_) return;
  done_ = true;  // a failed wait is not retried
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (auto& w : works_) w->wait();
    if (shm_) shm_->wait();
    if (epilogue_) epilogue_();
    comm_->stats_[op_].wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    comm_->fail(seq_, head_, e.what_without_backtrace());
  } catch (const std::exception& e) {
    comm_->fail(seq_, head_, e.what());
  }
  works_.clear();
  shm_.reset();
  epilogue_ = nullptr;
  comm_->complete(seq_);
}

// ------------------------------------------------------------------ Comm

Comm::Comm(c10::intrusive_ptr<c10d::Backend> group, int rank, int world_size,
           Backend backend, std::chrono::milliseconds timeout, size_t flight_capacity)
    : group_(std::move(group)),
      rank_(rank),
      world_(world_size),
      backend_(backend),
      timeout_(timeout),
      flight_capacity_(flight_capacity) {
  VLM_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "comm: bad rank ", rank,
            " for world size ", world_size);
  VLM_CHECK(group_ || world_size == 1, "comm: world size ", world_size,
            " needs a process group (hint: build it through ParallelDims::init)");
  set_shm(nullptr, "");
}

Comm::~Comm() { watchdog_.reset(); }

void Comm::set_shm(std::shared_ptr<ShmChannel> channel, std::string note) {
  shm_ = std::move(channel);
  if (shm_)
    transport_ = shm_->describe();
  else if (world_ == 1)
    transport_ = "none (world size 1)";
  else
    transport_ = str(backend_name(backend_), backend_ == Backend::kGloo ? " (tcp)" : "");
  if (!note.empty()) transport_ += "; " + note;
}

uint64_t Comm::enter(OpKind op, const std::string& what, const std::string& ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry e;
  e.seq = next_seq_++;
  e.op = op;
  e.what = what;
  e.context = ctx;
  flight_.push_back(std::move(e));
  flight_start_.push_back(std::chrono::steady_clock::now());
  while (flight_.size() > flight_capacity_) {
    flight_.pop_front();
    flight_start_.pop_front();
  }
  return next_seq_ - 1;
}

namespace {
template <typename Fn>
void with_entry(std::deque<FlightEntry>& flight,
                std::deque<std::chrono::steady_clock::time_point>& start, uint64_t seq, Fn fn) {
  for (size_t i = 0; i < flight.size(); ++i) {
    if (flight[i].seq != seq) continue;
    fn(flight[i], start[i]);
    return;
  }
}
}  // namespace

void Comm::complete(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  with_entry(flight_, flight_start_, seq, [](FlightEntry& e, auto t0) {
    e.state = FlightEntry::State::kCompleted;
    e.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  });
}

namespace {
std::string hint_for(const std::string& reason) {
  auto has = [&](const char* w) { return reason.find(w) != std::string::npos; };
  if (has("collective mismatch"))
    return "the ranks issued different collectives here; compare the last ops each rank entered";
  if (has("Timed out") || has("timed out") || has("Timeout") || has("Connection closed") ||
      has("Connection reset") || has("Broken pipe") || has("exited while"))
    return "a peer did not enter the same collective within the timeout, died, or issued a "
           "different op/size; read the first error in the other ranks' logs";
  return "the backend refused this op (dtype, size or device not supported?); see the "
         "fallbacks listed in sharding/dist/comm.h";
}
}  // namespace

void Comm::fail(uint64_t seq, const std::string& head, const std::string& reason) {
  throw Error(failure_report(seq, head, reason));
}

std::string Comm::failure_report(uint64_t seq, const std::string& head, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    with_entry(flight_, flight_start_, seq, [&](FlightEntry& e, auto t0) {
      e.state = FlightEntry::State::kFailed;
      e.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  std::string other;
  if (other_ != nullptr && world_ > 1)
    other = str("\n  last ops on this rank's ", other_->plane(), " plane, oldest first:\n", other_->flight_record());
  return str("comm: ", head, " failed on rank ", rank_, " of ", world_, " (", plane_, " plane, ",
             shm_ ? "shared memory" : backend_name(backend_), ", timeout ", timeout_.count() / 1000.0, " s): ", reason,
             "\n  hint: ", hint_for(reason), "\n  last ops on this rank (", plane_, " plane), oldest first:\n",
             flight_record(), other, peer_report(seq));
}

void Comm::start_watchdog(std::function<void(const std::string&)> on_timeout, std::chrono::milliseconds poll) {
  VLM_CHECK(watchdog_ == nullptr, "comm: the ", plane_, " plane's watchdog is already running");
  watchdog_ = std::make_unique<CommWatchdog>(
      timeout_, poll,
      [this](uint64_t seq, const std::string& head, const std::string& reason) {
        return failure_report(seq, head, reason);
      },
      std::move(on_timeout));
}

std::string Comm::peer_report(uint64_t failed_seq) {
  if (!store_ || world_ == 1) return "";
  auto key = [this](int r) { return str("vlm_comm/", plane_, "/last_op/", r); };
  std::string mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : flight_)
      if (e.seq == failed_seq) mine = e.to_string();
    if (!flight_.empty() && flight_.back().seq != failed_seq)
      mine += " (last entered: " + flight_.back().to_string() + ")";
  }
  std::vector<std::string> got(world_);
  std::vector<bool> have(world_, false);
  got[rank_] = mine;
  have[rank_] = true;
  std::string store_error;
  try {
    store_->set(key(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
    const auto deadline = std::chrono::steady_clock::now() + peer_report_wait_;
    for (;;) {
      bool all = true;
      for (int r = 0; r < world_; ++r) {
        if (have[r]) continue;
        if (store_->check({key(r)})) {
          std::vector<uint8_t> v = store_->get(key(r));
          got[r].assign(v.begin(), v.end());
          have[r] = true;
        } else {
          all = false;
        }
      }
      if (all || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (const std::exception& e) {
    store_error = e.what();
    store_error = store_error.substr(0, store_error.find('\n'));
  }
  std::ostringstream ss;
  ss << "  last op each rank entered (reported through the rendezvous store after the failure):\n";
  for (int r = 0; r < world_; ++r) {
    ss << "    rank " << r << ": "
       << (have[r] ? got[r]
                   : str("no report within ", peer_report_wait_.count() / 1000.0,
                         " s (dead, stuck outside the comm layer, or still waiting in an op)"))
       << "\n";
  }
  if (!store_error.empty())
    ss << "    (the store stopped answering: " << store_error
       << "; rank 0 hosts it, so rank 0 may be dead)\n";
  return ss.str();
}

std::string Comm::flight_record() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream ss;
  for (const auto& e : flight_) ss << "    " << e.to_string() << "\n";
  return ss.str();
}

void Comm::count(OpKind op, double logical, double wire) {
  OpStats& s = stats_[op];
  s.calls += 1;
  s.logical_bytes += logical;
  s.wire_bytes += wire;
}

Work Comm::launch(uint64_t seq, const std::function<WorkList()>& issue,
                  std::function<void()> epilogue) {
  Work w;
  w.comm_ = this;
  w.seq_ = seq;
  w.done_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    with_entry(flight_, flight_start_, seq, [&](FlightEntry& e, auto) {
      w.op_ = e.op;
      w.head_ = str(op_name(e.op), " #", e.seq, " ", e.what, " (context: ", e.context, ")");
    });
  }
  try {
    if (issue) w.works_ = issue();
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    fail(seq, w.head_, e.what_without_backtrace());
  } catch (const std::exception& e) {
    fail(seq, w.head_, e.what());
  }
  if (watchdog_) watchdog_->track(seq, w.head_, w.works_);
  w.epilogue_ = std::move(epilogue);
  return w;
}

Work Comm::launch_shm(uint64_t seq, std::shared_ptr<ShmTask> task) {
  Work w = launch(seq, nullptr, nullptr);
  w.shm_ = std::move(task);
  return w;
}

Work Comm::staged(Work w, std::function<void()> copy_back) {
  auto prev = std::move(w.epilogue_);
  w.epilogue_ = [prev = std::move(prev), copy_back = std::move(copy_back)]() {
    if (prev) prev();
    copy_back();
  };
  return w;
}

bool Comm::stage_on_host(const torch::Tensor& t) const {
  return world_ > 1 && t.is_cuda() && backend_ != Backend::kNccl;
}

Work Comm::all_reduce_async(const torch::Tensor& t, ReduceOp op, const std::string& ctx) {
  check_tensor(t, "all_reduce", "t");
  if (stage_on_host(t)) {
    torch::Tensor h = t.to(torch::kCPU);
    return staged(all_reduce_async(h, op, ctx + " (staged on the host)"), [t, h]() { t.copy_(h); });
  }
  VLM_CHECK(op != ReduceOp::kAvg || torch::isFloatingType(t.scalar_type()),
            "comm: all_reduce: avg needs a floating-point tensor, got ", describe(t),
            " (hint: use sum and divide yourself)");
  const double n = world_;
  const double m = static_cast<double>(t.numel()) * t.element_size();
  const double ring = 2.0 * (n - 1) / n;
  count(OpKind::kAllReduce, ring * m, ring * m);
  const uint64_t seq = enter(OpKind::kAllReduce, describe(t), ctx);
  if (world_ == 1) return launch(seq, nullptr, nullptr);
  if (shm_) return launch_shm(seq, shm_->all_reduce(t, op));

  auto issue = allreduce_issue(group_, t, op, timeout_);
  std::function<void()> epi;
  const int world = world_;
  if (op == ReduceOp::kAvg) epi = [t, world]() { t.div_(world); };
  return launch(seq, issue, std::move(epi));
}

Work Comm::all_gather_async(const torch::Tensor& out, const torch::Tensor& in,
                            const std::string& ctx) {
  check_tensor(out, "all_gather", "out");
  check_tensor(in, "all_gather", "in");
  VLM_CHECK(out.scalar_type() == in.scalar_type() && out.device() == in.device(),
            "comm: all_gather: out and in must share dtype and device, got out ", describe(out),
            " on ", out.device(), ", in ", describe(in), " on ", in.device());
  VLM_CHECK(out.numel() == in.numel() * world_, "comm: all_gather: out must hold world_size (",
            world_, ") x in.numel() (", in.numel(), ") = ", in.numel() * world_,
            " elements, got ", out.numel(), " (hint: pad the flat buffer to a multiple of N)");
  if (stage_on_host(out)) {
    torch::Tensor ho = torch::empty(out.sizes(), out.options().device(torch::kCPU)), hi = in.to(torch::kCPU);
    return staged(all_gather_async(ho, hi, ctx + " (staged on the host)"), [out, ho]() { out.copy_(ho); });
  }
  const double n = world_;
  const double m = static_cast<double>(out.numel()) * out.element_size();
  count(OpKind::kAllGather, (n - 1) / n * m, (n - 1) / n * m);
  const bool native_flat = native_flat_ops(backend_);
  const uint64_t seq =
      enter(OpKind::kAllGather, str(describe(in), " -> ", describe(out),
                                    shm_ || native_flat ? "" : " via one broadcast per rank"), ctx);
  if (world_ == 1) {
    if (out.data_ptr() != in.data_ptr()) out.view(-1).copy_(in.view(-1));
    return launch(seq, nullptr, nullptr);
  }
  if (shm_) return launch_shm(seq, shm_->all_gather(out, in));
  torch::Tensor o = as_bits(out).view(-1), i = as_bits(in).view(-1);
  const int64_t s = i.numel();
  const int world = world_, rank = rank_;
  if (!native_flat && o.data_ptr() != i.data_ptr()) o.narrow(0, rank * s, s).copy_(i);
  auto issue = [this, o, i, s, world, native_flat]() mutable {
    if (native_flat) {
      c10d::AllgatherOptions opts;
      opts.timeout = timeout_;
      torch::Tensor oo = o, ii = i;
      return WorkList{group_->_allgather_base(oo, ii, opts)};
    }
    // Gloo: one broadcast per rank of its slice, straight into the views of `out`. Gloo's
    // own allgather stages through a flat buffer it allocates per call and copies out of:
    // 2.2x the time of the broadcasts at world 2 for an 11 MB unit, 2.4x for 82 MB
    // (scripts/bench/gloo_ops.py, docs/notes/cpu_comm.md).
    WorkList works;
    for (int r = 0; r < world; ++r) {
      c10d::BroadcastOptions bo;
      bo.rootRank = r;
      bo.rootTensor = 0;
      bo.timeout = timeout_;
      std::vector<torch::Tensor> v{o.narrow(0, r * s, s)};
      works.push_back(group_->broadcast(v, bo));
    }
    return works;
  };
  return launch(seq, issue, nullptr);
}

Work Comm::reduce_scatter_async(const torch::Tensor& out, const torch::Tensor& in, ReduceOp op,
                                const std::string& ctx) {
  check_tensor(out, "reduce_scatter", "out");
  check_tensor(in, "reduce_scatter", "in");
  VLM_CHECK(op != ReduceOp::kAvg || torch::isFloatingType(in.scalar_type()),
            "comm: reduce_scatter: avg needs a floating-point tensor, got ", describe(in),
            " (hint: use sum and divide yourself)");
  VLM_CHECK(out.scalar_type() == in.scalar_type() && out.device() == in.device(),
            "comm: reduce_scatter: out and in must share dtype and device, got out ",
            describe(out), " on ", out.device(), ", in ", describe(in), " on ", in.device());
  VLM_CHECK(in.numel() == out.numel() * world_, "comm: reduce_scatter: in must hold world_size (",
            world_, ") x out.numel() (", out.numel(), ") = ", out.numel() * world_,
            " elements, got ", in.numel(), " (hint: pad the flat buffer to a multiple of N)");
  if (stage_on_host(out)) {
    torch::Tensor ho = torch::empty(out.sizes(), out.options().device(torch::kCPU)), hi = in.to(torch::kCPU);
    return staged(reduce_scatter_async(ho, hi, op, ctx + " (staged on the host)"), [out, ho]() { out.copy_(ho); });
  }
  const double n = world_;
  const double m = static_cast<double>(in.numel()) * in.element_size();
  const bool native_flat = native_flat_ops(backend_);
  // Native and the Gloo all-to-all fallback both move the ring volume.
  count(OpKind::kReduceScatter, (n - 1) / n * m, (n - 1) / n * m);
  const uint64_t seq = enter(OpKind::kReduceScatter,
                             str(describe(in), " -> ", describe(out),
                                 shm_ || native_flat ? "" : " via all_to_all + local reduce"),
                             ctx);
  const int world = world_;
  if (world_ == 1) {
    if (out.data_ptr() != in.data_ptr()) out.view(-1).copy_(in.view(-1));
    return launch(seq, nullptr, nullptr);
  }
  if (shm_) return launch_shm(seq, shm_->reduce_scatter(out, in, op));
  if (native_flat) {
    auto issue = [this, out, in, op]() mutable {
      c10d::ReduceScatterOptions o;
      o.reduceOp = to_c10d(op);
      o.timeout = timeout_;
      torch::Tensor oo = out.view(-1), ii = in.view(-1);
      return WorkList{group_->_reduce_scatter_base(oo, ii, o)};
    };
    std::function<void()> epi;
    if (op == ReduceOp::kAvg) epi = [out, world]() { out.div_(world); };
    return launch(seq, issue, std::move(epi));
  }
  // Gloo: an all-to-all sends chunk k of `in` to rank k in its own dtype (2-byte floats as
  // raw bytes), then this rank reduces the N chunks it received (2-byte floats in fp32, as
  // the all-reduce fallback does). Half the bytes of an all-reduce of the whole buffer, and
  // about half the time for FSDP-unit sizes (scripts/bench/gloo_ops.py, docs/notes/cpu_comm.md).
  torch::Tensor send = as_bits(in).view(-1);     // [N*S] (x2 for 2-byte floats)
  torch::Tensor recv = torch::empty_like(send);  // chunk k: rank k's in[r*S:(r+1)*S]
  auto issue = [this, send, recv]() mutable {
    c10d::AllToAllOptions o;
    o.timeout = timeout_;
    std::vector<int64_t> equal_splits;  // empty: N equal chunks
    return WorkList{group_->alltoall_base(recv, send, equal_splits, equal_splits, o)};
  };
  auto epi = [out, in, recv, op, world]() {
    const bool half = is_half(in.scalar_type());
    torch::Tensor chunks = (half ? recv.view(in.scalar_type()).to(torch::kFloat) : recv).view({world, -1});  // [N, S]
    torch::Tensor o = out.view(-1);
    if (op == ReduceOp::kMax || op == ReduceOp::kMin) {
      o.copy_(std::get<0>(op == ReduceOp::kMax ? chunks.max(0) : chunks.min(0)));
      return;
    }
    if (half) {
      torch::Tensor sum = chunks.sum(0);
      if (op == ReduceOp::kAvg) sum.div_(world);
      o.copy_(sum);
      return;
    }
    torch::sum_out(o, chunks, {0});
    if (op == ReduceOp::kAvg) o.div_(world);
  };
  return launch(seq, issue, epi);
}

Work Comm::broadcast_async(const torch::Tensor& t, int root, const std::string& ctx) {
  check_tensor(t, "broadcast", "t");
  VLM_CHECK(root >= 0 && root < world_, "comm: broadcast: root must be in [0, ", world_,
            "), got ", root);
  if (stage_on_host(t)) {
    torch::Tensor h = t.to(torch::kCPU);
    return staged(broadcast_async(h, root, ctx + " (staged on the host)"), [t, h]() { t.copy_(h); });
  }
  const double m = world_ > 1 ? static_cast<double>(t.numel()) * t.element_size() : 0.0;
  count(OpKind::kBroadcast, m, m);
  const uint64_t seq = enter(OpKind::kBroadcast, str(describe(t), " from rank ", root), ctx);
  if (world_ == 1) return launch(seq, nullptr, nullptr);
  if (shm_) return launch_shm(seq, shm_->broadcast(t, root));
  torch::Tensor b = backend_ == Backend::kNccl ? t : as_bits(t);
  auto issue = [this, b, root]() mutable {
    std::vector<torch::Tensor> v{b};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.rootTensor = 0;
    o.timeout = timeout_;
    return WorkList{group_->broadcast(v, o)};
  };
  return launch(seq, issue, nullptr);
}

void Comm::barrier(const std::string& ctx) {
  count(OpKind::kBarrier, 0, 0);
  const uint64_t seq = enter(OpKind::kBarrier, "", ctx);
  if (world_ == 1) return launch(seq, nullptr, nullptr).wait();
  if (shm_) return launch_shm(seq, shm_->barrier()).wait();
  auto issue = [this]() {
    c10d::BarrierOptions o;
    o.timeout = timeout_;
    return WorkList{group_->barrier(o)};
  };
  launch(seq, issue, nullptr).wait();
}

}  // namespace vlm::sharding
