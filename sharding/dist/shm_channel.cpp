#include "sharding/dist/shm_channel.h"

#include <ATen/Dispatch.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <stdexcept>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "vlm/runtime/check.h"

namespace vlm::sharding {

// ------------------------------------------------------------------ shared layout

namespace {
constexpr uint64_t kMagic = 0x766c6d73686d3031ULL;  // "vlmshm01"
constexpr size_t kControlBytes = 4096;
constexpr int kSpins = 2000;                        // pause loops before sleeping
constexpr auto kSleep = std::chrono::milliseconds(20);
constexpr auto kLivenessEvery = std::chrono::milliseconds(200);

// What a rank posted in a round; peers compare it with their own.
struct Descriptor {
  uint32_t round = 0;
  uint32_t kind = 0;
  uint64_t index = 0;  // op index on the channel
  uint64_t bytes = 0;  // the op's total bytes (same on every rank for matching ops)
  int32_t root = 0;
  int32_t op = 0;
};
}  // namespace

struct ShmChannel::Control {
  uint64_t magic = kMagic;
  int32_t rank = 0;
  int32_t pid = 0;
  uint64_t buffer_bytes = kBufferBytes;
  alignas(64) std::atomic<uint32_t> posted{0};   // last round this rank posted
  alignas(64) std::atomic<uint32_t> done{0};     // last round this rank finished reading
  alignas(64) std::atomic<uint32_t> waiters{0};  // peers asleep on posted / done
  alignas(64) Descriptor desc[2];                // by buffer
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared atomics must be lock-free");

namespace {

size_t segment_bytes() { return kControlBytes + 2 * ShmChannel::kBufferBytes; }

bool reached(uint32_t v, uint32_t target) { return static_cast<int32_t>(v - target) >= 0; }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Futexes on a MAP_SHARED word work across processes (no FUTEX_PRIVATE_FLAG).
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::milliseconds timeout) {
  timespec ts{0, static_cast<long>(timeout.count()) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

const char* kind_name(uint32_t k) {
  switch (static_cast<ShmTask::Kind>(k)) {
    case ShmTask::Kind::kAllReduce: return "all_reduce";
    case ShmTask::Kind::kAllGather: return "all_gather";
    case ShmTask::Kind::kReduceScatter: return "reduce_scatter";
    case ShmTask::Kind::kBroadcast: return "broadcast";
    case ShmTask::Kind::kBarrier: return "barrier";
  }
  return "?";
}

const char* reduce_name(int32_t op) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

std::string describe_task(const ShmTask& t) {
  return str(kind_name(static_cast<uint32_t>(t.kind)), " (op ", t.index, " on the shm channel)");
}

// dst[i] = reduce over s of src[s][i], i < n; src in rank order. dst may alias one of src
// (each block is read whole before it is written). 2-byte floats accumulate in fp32.
template <typename T>
void reduce_typed(T* dst, const T* const* src, int nsrc, int64_t n, ReduceOp op, int world) {
  using A = std::conditional_t<std::is_same_v<T, at::Half> || std::is_same_v<T, at::BFloat16>, float, T>;
  constexpr int64_t kBlock = 512;
  A acc[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t m = std::min(kBlock, n - i0);
    for (int64_t i = 0; i < m; ++i) acc[i] = static_cast<A>(src[0][i0 + i]);
    for (int s = 1; s < nsrc; ++s) {
      const T* p = src[s] + i0;
      if (op == ReduceOp::kMax) {
        for (int64_t i = 0; i < m; ++i) acc[i] = std::max(acc[i], static_cast<A>(p[i]));
      } else if (op == ReduceOp::kMin) {
        for (int64_t i = 0; i < m; ++i) acc[i] = std::min(acc[i], static_cast<A>(p[i]));
      } else {
        for (int64_t i = 0; i < m; ++i) acc[i] += static_cast<A>(p[i]);
      }
    }
    if (op == ReduceOp::kAvg)
      for (int64_t i = 0; i < m; ++i) acc[i] /= static_cast<A>(world);
    for (int64_t i = 0; i < m; ++i) dst[i0 + i] = static_cast<T>(acc[i]);
  }
}

void reduce_bytes(char* dst, const std::vector<const char*>& src, int64_t n, torch::ScalarType dtype,
                  ReduceOp op, int world) {
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "shm_reduce", [&] {
    std::vector<const scalar_t*> s(src.size());
    for (size_t i = 0; i < src.size(); ++i) s[i] = reinterpret_cast<const scalar_t*>(src[i]);
    reduce_typed<scalar_t>(reinterpret_cast<scalar_t*>(dst), s.data(), static_cast<int>(s.size()), n, op, world);
  });
}

char* bytes_of(const torch::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// Calls fn(off, len) for consecutive pieces of [0, n) of at most `step` each; once with
// (0, 0) when n is 0, so an empty op still runs one round (and is matched across ranks).
template <typename Fn>
void for_each_shm_piece(uint64_t n, uint64_t step, Fn&& fn) {
  uint64_t off = 0;
  do {
    const uint64_t len = std::min(step, n - off);
    fn(off, len);
    off += len;
  } while (off < n);
}

// ------------------------------------------------------------------ set-up helpers

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::string link_target(const char* path) {
  char buf[256];
  const ssize_t n = readlink(path, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Equal on two processes iff they can share /dev/shm segments and see each other's pids:
// same boot, same IPC and pid namespaces, same /dev/shm file system.
std::string host_identity() {
  struct stat st {};
  const bool shm = stat("/dev/shm", &st) == 0;
  return str(read_first_line("/proc/sys/kernel/random/boot_id"), "|", link_target("/proc/self/ns/ipc"), "|",
             link_target("/proc/self/ns/pid"), "|",
             shm ? str(st.st_dev, ":", st.st_ino) : std::string("no /dev/shm"));
}

void unmap(void* base, size_t bytes) {
  if (base) munmap(base, bytes);
}

std::string store_get(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key) {
  const std::vector<uint8_t> v = store->get(key);
  return std::string(v.begin(), v.end());
}
void store_set(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, const std::string& value) {
  store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

}  // namespace

// ------------------------------------------------------------------ ShmTask

void ShmTask::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_; });
  if (!error_.empty()) throw std::runtime_error(error_);
}

// ------------------------------------------------------------------ set-up

std::shared_ptr<ShmChannel> ShmChannel::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                               int world, std::chrono::milliseconds timeout,
                                               std::string* why_not, const std::string& host_id) {
  VLM_CHECK(store && world >= 2 && rank >= 0 && rank < world, "shm channel: needs a store and world >= 2");
  // Every rank adds 1: channels created one after another in one job get their own keys.
  const int64_t epoch = (store->add("vlm_shm/count", 1) - 1) / world;
  auto key = [&](const char* what, int r) { return str("vlm_shm/", epoch, "/", what, "/", r); };
  // All ranks read the same values in each of the three exchanges below, so they reach
  // the same decision; the first failing rank's reason is what every rank reports.
  auto exchange = [&](const char* what, const std::string& mine) {
    store_set(store, key(what, rank), mine);
    std::vector<std::string> all(world);
    for (int r = 0; r < world; ++r) all[r] = r == rank ? mine : store_get(store, key(what, r));
    return all;
  };
  auto first_failure = [](const std::vector<std::string>& all) -> std::string {
    for (size_t r = 0; r < all.size(); ++r)
      if (all[r].rfind("ok", 0) != 0) return str("rank ", r, ": ", all[r]);
    return "";
  };

  // 1. Same host (and container)?
  const std::vector<std::string> ids = exchange("host", host_id.empty() ? host_identity() : host_id);
  for (int r = 1; r < world; ++r) {
    if (ids[r] != ids[0]) {
      *why_not = str("the ranks are not all on one host (rank ", r, " differs from rank 0 in boot id, "
                     "namespaces or /dev/shm)");
      return nullptr;
    }
  }

  // 2. Each rank creates its own segment.
  std::vector<Segment> segs(world);
  const size_t bytes = segment_bytes();
  std::string made;
  {
    std::random_device rd;
    Segment& own = segs[rank];
    own.name = str("/vlmtrain-", getpid(), "-", std::hex, (uint64_t{rd()} << 32) ^ rd());
    const int fd = shm_open(own.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      made = str("cannot create /dev/shm", own.name, ": ", std::strerror(errno));
      own.name.clear();
    } else {
      // posix_fallocate reserves the pages now: a full /dev/shm is an error here, not a
      // SIGBUS at the first write.
      const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      void* p = rc == 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
      const int map_errno = errno;
      close(fd);
      if (rc != 0 || p == MAP_FAILED) {
        made = rc != 0 ? str("cannot reserve ", bytes >> 20, " MiB in /dev/shm: ", std::strerror(rc),
                             " (hint: enlarge /dev/shm, e.g. docker run --shm-size=1g)")
                       : str("cannot map ", own.name, ": ", std::strerror(map_errno));
        shm_unlink(own.name.c_str());
        own.name.clear();
      } else {
        own.base = p;
        own.bytes = bytes;
        auto* c = new (p) Control();
        c->rank = rank;
        c->pid = static_cast<int32_t>(getpid());
        made = "ok " + own.name;
      }
    }
  }
  auto cleanup = [&] {
    for (auto& s : segs) unmap(s.base, s.bytes);
    if (!segs[rank].name.empty()) shm_unlink(segs[rank].name.c_str());
  };
  const std::vector<std::string> names = exchange("made", made);
  if (std::string f = first_failure(names); !f.empty()) {
    cleanup();
    *why_not = f;
    return nullptr;
  }

  // 3. Map the peers' segments.
  std::string mapped = "ok";
  for (int r = 0; r < world && mapped == "ok"; ++r) {
    if (r == rank) continue;
    const std::string name = names[r].substr(3);
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      mapped = str("cannot open rank ", r, "'s /dev/shm", name, ": ",
                   fd < 0 ? std::strerror(errno) : "wrong size");
      if (fd >= 0) close(fd);
      break;
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
      mapped = str("cannot map rank ", r, "'s /dev/shm", name, ": ", std::strerror(errno));
      break;
    }
    segs[r].base = p;
    segs[r].bytes = bytes;
    const auto* c = static_cast<const Control*>(p);
    if (c->magic != kMagic || c->rank != r || c->buffer_bytes != kBufferBytes)
      mapped = str("rank ", r, "'s segment ", name, " has an unexpected header (another vlmtrain version?)");
  }
  const std::vector<std::string> maps = exchange("mapped", mapped);
  // Every rank mapped every segment (or gave up): the names can go.
  shm_unlink(segs[rank].name.c_str());
  segs[rank].name.clear();
  if (std::string f = first_failure(maps); !f.empty()) {
    cleanup();
    *why_not = f;
    return nullptr;
  }
  return std::shared_ptr<ShmChannel>(new ShmChannel(rank, world, timeout, std::move(segs)));
}

ShmChannel::ShmChannel(int rank, int world, std::chrono::milliseconds timeout, std::vector<Segment> segs)
    : rank_(rank), world_(world), timeout_(timeout), segs_(std::move(segs)) {
  static_assert(sizeof(Control) <= kControlBytes, "control block outgrew its page");
  thread_ = std::thread([this] { loop(); });
}

ShmChannel::~ShmChannel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& s : segs_) unmap(s.base, s.bytes);
}

std::string ShmChannel::describe() const {
  return str("shared memory (/dev/shm, ", segment_bytes() >> 20, " MiB per rank)");
}

ShmChannel::Control* ShmChannel::ctrl(int r) const { return static_cast<Control*>(segs_[r].base); }
char* ShmChannel::buffer(int r, int b) const {
  return static_cast<char*>(segs_[r].base) + kControlBytes + static_cast<size_t>(b) * kBufferBytes;
}

// ------------------------------------------------------------------ progress thread

std::shared_ptr<ShmTask> ShmChannel::submit(std::shared_ptr<ShmTask> t) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    t->index = next_index_++;
    queue_.push_back(t);
  }
  cv_.notify_one();
  return t;
}

void ShmChannel::loop() {
  for (;;) {
    std::shared_ptr<ShmTask> t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      t = queue_.front();
      queue_.pop_front();
    }
    std::string error;
    if (!broken_.empty()) {
      error = "the shared-memory channel failed in an earlier op: " + broken_;
    } else {
      try {
        run(*t);
      } catch (const std::exception& e) {
        error = e.what();
        broken_ = error;
      }
    }
    {
      std::lock_guard<std::mutex> lock(t->mu_);
      t->finished_ = true;
      t->error_ = error;
      t->a = torch::Tensor();  // drop the references now, not when the handle goes
      t->b = torch::Tensor();
    }
    t->cv_.notify_all();
  }
}

void ShmChannel::run(ShmTask& t) {
  op_start_ = std::chrono::steady_clock::now();
  switch (t.kind) {
    case ShmTask::Kind::kAllReduce: return run_all_reduce(t);
    case ShmTask::Kind::kAllGather: return run_all_gather(t);
    case ShmTask::Kind::kReduceScatter: return run_reduce_scatter(t);
    case ShmTask::Kind::kBroadcast: return run_broadcast(t);
    case ShmTask::Kind::kBarrier: return round(t, 0, [](char*) {}, [](int) {});
  }
}

void ShmChannel::await(int peer, std::atomic<uint32_t>& word, uint32_t target, const ShmTask& t,
                       const char* what) {
  for (int i = 0; i < kSpins; ++i) {
    if (reached(word.load(std::memory_order_acquire), target)) return;
    cpu_relax();
  }
  std::atomic<uint32_t>& waiters = ctrl(peer)->waiters;
  auto next_check = std::chrono::steady_clock::now() + kLivenessEvery;
  for (;;) {
    // Announce the sleep before re-reading the word; the poster stores the word, then reads
    // `waiters` (both sequentially consistent), so one of the two sees the other.
    waiters.fetch_add(1);
    const uint32_t v = word.load();
    if (!reached(v, target)) futex_wait(&word, v, kSleep);
    waiters.fetch_sub(1);
    if (reached(word.load(std::memory_order_acquire), target)) return;
    if (stop_) throw std::runtime_error(str(describe_task(t), ": the channel was closed while waiting"));
    const auto now = std::chrono::steady_clock::now();
    if (now - op_start_ >= timeout_)
      throw std::runtime_error(str(describe_task(t), ": timed out after ", timeout_.count() / 1000.0,
                                   " s waiting for rank ", peer, " to ", what, " round ", target,
                                   " (it is late, stuck, or in another op)"));
    if (now >= next_check) {
      const int pid = ctrl(peer)->pid;
      if (kill(pid, 0) != 0 && errno == ESRCH)
        throw std::runtime_error(str(describe_task(t), ": rank ", peer, " (pid ", pid,
                                     ") exited while this rank waited for it to ", what, " round ", target));
      next_check = now + kLivenessEvery;
    }
  }
}

void ShmChannel::check_descriptor(int peer, int buf, uint32_t k, const ShmTask& t, uint64_t bytes) const {
  const Descriptor& d = ctrl(peer)->desc[buf];
  const bool same = d.round == k && d.kind == static_cast<uint32_t>(t.kind) && d.index == t.index &&
                    d.bytes == bytes && d.root == t.root && d.op == static_cast<int32_t>(t.op);
  if (same) return;
  auto side = [](uint32_t kind, uint64_t b, uint64_t index, int32_t root, int32_t op) {
    return str(kind_name(kind), " of ", b, " bytes (op ", index, " on the channel, root ", root, ", ",
               reduce_name(op), ")");
  };
  throw std::runtime_error(str("collective mismatch: this rank (", rank_, ") is in ",
                               side(static_cast<uint32_t>(t.kind), bytes, t.index, t.root, static_cast<int32_t>(t.op)),
                               ", rank ", peer, " posted ", side(d.kind, d.bytes, d.index, d.root, d.op),
                               " in round ", k));
}

template <typename Fill, typename Consume>
void ShmChannel::round(const ShmTask& t, uint64_t bytes, Fill&& fill, Consume&& consume) {
  const uint64_t k64 = ++round_;
  const auto k = static_cast<uint32_t>(k64);
  const int b = static_cast<int>(k64 & 1);
  Control* me = ctrl(rank_);
  // 1. My buffer b is free once every peer finished reading round k-2 from it.
  if (k64 > 2)
    for (int p = 0; p < world_; ++p)
      if (p != rank_) await(p, ctrl(p)->done, k - 2, t, "finish reading");
  // 2. Write and post.
  fill(buffer(rank_, b));
  Descriptor& d = me->desc[b];
  d.round = k;
  d.kind = static_cast<uint32_t>(t.kind);
  d.index = t.index;
  d.bytes = bytes;
  d.root = t.root;
  d.op = static_cast<int32_t>(t.op);
  me->posted.store(k);
  if (me->waiters.load() > 0) futex_wake(&me->posted);
  // 3. Every peer posted the same round of the same op.
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    await(p, ctrl(p)->posted, k, t, "post");
    check_descriptor(p, b, k, t, bytes);
  }
  // 4. Read, then release.
  consume(b);
  me->done.store(k);
  if (me->waiters.load() > 0) futex_wake(&me->done);
}

// ------------------------------------------------------------------ ops

void ShmChannel::run_all_gather(ShmTask& t) {
  char* out = bytes_of(t.a);
  const char* in = bytes_of(t.b);
  const uint64_t s = t.b.nbytes();
  if (in != out + rank_ * s) std::memcpy(out + rank_ * s, in, s);
  const uint64_t total = s * world_;
  for_each_shm_piece(s, kBufferBytes, [&](uint64_t off, uint64_t c) {
    round(
        t, total, [&](char* mine) { std::memcpy(mine, in + off, c); },
        [&](int b) {
          for (int p = 0; p < world_; ++p)
            if (p != rank_) std::memcpy(out + p * s + off, buffer(p, b), c);
        });
  });
}

void ShmChannel::run_reduce_scatter(ShmTask& t) {
  const torch::ScalarType dtype = t.a.scalar_type();
  const uint64_t esz = t.a.element_size();
  const uint64_t s = t.a.numel();  // shard elements
  char* out = bytes_of(t.a);
  const char* in = bytes_of(t.b);
  const uint64_t cmax = std::max<uint64_t>(1, kBufferBytes / (world_ * esz));  // piece elements
  const uint64_t total = t.b.nbytes();
  std::vector<const char*> src(world_);
  for_each_shm_piece(s, cmax, [&](uint64_t off, uint64_t c) {
    round(
        t, total,
        [&](char* mine) {
          for (int p = 0; p < world_; ++p)
            if (p != rank_) std::memcpy(mine + p * cmax * esz, in + (p * s + off) * esz, c * esz);
        },
        [&](int b) {
          for (int q = 0; q < world_; ++q)
            src[q] = q == rank_ ? in + (rank_ * s + off) * esz : buffer(q, b) + rank_ * cmax * esz;
          reduce_bytes(out + off * esz, src, static_cast<int64_t>(c), dtype, t.op, world_);
        });
  });
}

void ShmChannel::run_all_reduce(ShmTask& t) {
  const torch::ScalarType dtype = t.a.scalar_type();
  const uint64_t esz = t.a.element_size();
  const uint64_t n = t.a.numel();
  char* data = bytes_of(t.a);
  const uint64_t pmax = kBufferBytes / esz;  // piece elements
  const uint64_t total = t.a.nbytes();
  std::vector<const char*> src(world_);
  for_each_shm_piece(n, pmax, [&](uint64_t off, uint64_t len) {
    auto lo = [&](int q) { return len * static_cast<uint64_t>(q) / world_; };  // slice q: [lo(q), lo(q+1))
    const uint64_t my_lo = lo(rank_), my_n = lo(rank_ + 1) - my_lo;
    // Round 1: post the slices the peers reduce (not my own: I read that from `t`); reduce
    // my slice over all ranks, in place.
    round(
        t, total,
        [&](char* mine) {
          for (int q = 0; q < world_; ++q)
            if (q != rank_) std::memcpy(mine + lo(q) * esz, data + (off + lo(q)) * esz, (lo(q + 1) - lo(q)) * esz);
        },
        [&](int b) {
          for (int q = 0; q < world_; ++q)
            src[q] = q == rank_ ? data + (off + my_lo) * esz : buffer(q, b) + my_lo * esz;
          reduce_bytes(data + (off + my_lo) * esz, src, static_cast<int64_t>(my_n), dtype, t.op, world_);
        });
    // Round 2: post my reduced slice; copy the peers' slices.
    round(
        t, total, [&](char* mine) { std::memcpy(mine + my_lo * esz, data + (off + my_lo) * esz, my_n * esz); },
        [&](int b) {
          for (int p = 0; p < world_; ++p) {
            if (p == rank_) continue;
            std::memcpy(data + (off + lo(p)) * esz, buffer(p, b) + lo(p) * esz, (lo(p + 1) - lo(p)) * esz);
          }
        });
  });
}

void ShmChannel::run_broadcast(ShmTask& t) {
  char* data = bytes_of(t.a);
  const uint64_t s = t.a.nbytes();
  const bool root = rank_ == t.root;
  for_each_shm_piece(s, kBufferBytes, [&](uint64_t off, uint64_t c) {
    round(
        t, s, [&](char* mine) { if (root) std::memcpy(mine, data + off, c); },
        [&](int b) { if (!root) std::memcpy(data + off, buffer(t.root, b), c); });
  });
}

// ------------------------------------------------------------------ submission

namespace {
std::shared_ptr<ShmTask> make(ShmTask::Kind kind, torch::Tensor a, torch::Tensor b, ReduceOp op, int root) {
  auto t = std::make_shared<ShmTask>();
  t->kind = kind;
  t->a = std::move(a);
  t->b = std::move(b);
  t->op = op;
  t->root = root;
  return t;
}
}  // namespace

std::shared_ptr<ShmTask> ShmChannel::all_reduce(const torch::Tensor& t, ReduceOp op) {
  return submit(make(ShmTask::Kind::kAllReduce, t, {}, op, 0));
}
std::shared_ptr<ShmTask> ShmChannel::all_gather(const torch::Tensor& out, const torch::Tensor& in) {
  return submit(make(ShmTask::Kind::kAllGather, out, in, ReduceOp::kSum, 0));
}
std::shared_ptr<ShmTask> ShmChannel::reduce_scatter(const torch::Tensor& out, const torch::Tensor& in, ReduceOp op) {
  return submit(make(ShmTask::Kind::kReduceScatter, out, in, op, 0));
}
std::shared_ptr<ShmTask> ShmChannel::broadcast(const torch::Tensor& t, int root) {
  return submit(make(ShmTask::Kind::kBroadcast, t, {}, ReduceOp::kSum, root));
}
std::shared_ptr<ShmTask> ShmChannel::barrier() {
  return submit(make(ShmTask::Kind::kBarrier, {}, {}, ReduceOp::kSum, 0));
}

}  // namespace vlm::sharding
