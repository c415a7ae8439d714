#include "app/launch/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <optional>

#include <nlohmann/json.hpp>

#include "vlm/runtime/check.h"

extern char** environ;

namespace vlm::app {

using vlm::str;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- environment

namespace {

bool is_launcher_var(const std::string& key) {
  static const char* exact[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME",
                                "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  for (const char* e : exact)
    if (key == e) return true;
  return key.rfind("SLURM_", 0) == 0 || key.rfind("TORCHELASTIC_", 0) == 0;
}

}  // namespace

std::vector<std::string> worker_env(const LaunchOptions& o, int local_rank,
                                    const std::map<std::string, std::string>& base,
                                    const std::string& error_file) {
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : base)
    if (!is_launcher_var(k)) env[k] = v;
  const int world = o.nnodes * o.nproc_per_node;
  const int rank = o.node_rank * o.nproc_per_node + local_rank;
  env["RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = std::to_string(world);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc_per_node);
  env["GROUP_RANK"] = std::to_string(o.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(o.nnodes);
  env["ROLE_RANK"] = std::to_string(rank);
  env["ROLE_WORLD_SIZE"] = std::to_string(world);
  env["ROLE_NAME"] = "default";
  env["MASTER_ADDR"] = o.master_addr;
  env["MASTER_PORT"] = std::to_string(o.master_port);
  env["TORCHELASTIC_RUN_ID"] = o.run_id.empty() ? "none" : o.run_id;
  env["TORCHELASTIC_RESTART_COUNT"] = "0";
  env["TORCHELASTIC_MAX_RESTARTS"] = "0";
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  env["TORCHELASTIC_ERROR_FILE"] = error_file;
  if (o.nproc_per_node > 1 && !env.count("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = "1";
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

int pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  VLM_CHECK(fd >= 0, "vlmtrain launch: socket() failed: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  VLM_CHECK(ok, "vlmtrain launch: cannot find a free port: ", std::strerror(err),
            " (hint: pass --master-port)");
  return ntohs(addr.sin_port);
}

// ---------------------------------------------------------------- supervision

namespace {

int g_signal_pipe = -1;  // write end of the self-pipe; the handler writes the signal number

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const char c = static_cast<char>(sig);
  if (g_signal_pipe >= 0) (void)!::write(g_signal_pipe, &c, 1);
  errno = saved;
}

// Installs the launcher's signal handlers for its lifetime and restores the old ones.
class SignalGuard {
 public:
  SignalGuard() {
    VLM_CHECK(::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) == 0, "vlmtrain launch: pipe2 failed: ",
              std::strerror(errno));
    g_signal_pipe = pipe_[1];
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int i = 0; i < kN; ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, &old_pipe_);  // a closed stdout must not kill the launcher
  }
  ~SignalGuard() {
    for (int i = 0; i < kN; ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    g_signal_pipe = -1;
    ::close(pipe_[0]);
    ::close(pipe_[1]);
  }
  int read_fd() const { return pipe_[0]; }

  static constexpr int kN = 4;
  static constexpr int kSignals[kN] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

 private:
  int pipe_[2] = {-1, -1};
  struct sigaction old_[kN];
  struct sigaction old_pipe_;
};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGPIPE: return "SIGPIPE";
    case SIGTERM: return "SIGTERM";
    default: return "signal";
  }
}

// Writes all of `s` to `fd` (one write for a short line, so lines of different ranks do
// not interleave when fd is a pipe).
void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stdout closed: drop the output, keep supervising
    off += static_cast<size_t>(n);
  }
}

// One of a worker's output streams: a pipe read end, copied line by line to `to_fd`.
struct Stream {
  int fd = -1;
  int to_fd = 1;
  std::string pending;  // bytes after the last newline
};

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;           // waitpid status once exited
  double exit_s = 0;        // seconds after start
  bool stopped_by_us = false;
  std::string error_file;
  Stream out, err;
  int log_fd = -1;          // <log_dir>/rank<R>.log, or -1
};

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return str("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return str("killed by ", signal_name(WTERMSIG(status)), " (", WTERMSIG(status), ")");
  return "unknown status";
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// The message of a torchrun error file: {"message": "..."} (ours and non-Python workers)
// or {"message": {"message": "...", "extraInfo": ...}} (torch.distributed.elastic).
std::string read_error_message(const std::string& path) {
  std::ifstream f(path);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  try {
    auto j = nlohmann::json::parse(text);
    auto m = j.at("message");
    if (m.is_object() && m.contains("message")) m = m.at("message");
    return m.is_string() ? m.get<std::string>() : m.dump();
  } catch (const std::exception&) {
    return text;
  }
}

std::string indent(const std::string& text, const std::string& pad) {
  std::string out = pad;
  for (size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    if (text[i] == '\n' && i + 1 < text.size()) out += pad;
  }
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out;
}

class Supervisor {
 public:
  Supervisor(const LaunchOptions& o, std::string dir) : o_(o), dir_(std::move(dir)) {}

  int run();

 private:
  void prepare_workers();
  void start_workers();
  void supervise(int signal_fd);
  void poll_once(int signal_fd);
  void on_signals(int signal_fd);
  int verdict();
  void spawn(Worker& w);
  void pump(Worker& w, Stream& s);
  void emit_lines(Worker& w, Stream& s, bool flush_all);
  void close_stream(Worker& w, Stream& s);
  void reap();
  void signal_all(int sig, bool mark);
  double now_s() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  void say(const std::string& line) { write_all(2, "vlmtrain launch: " + line + "\n"); }

  const LaunchOptions& o_;
  std::string dir_;
  std::vector<Worker> workers_;
  Clock::time_point t0_ = Clock::now();
  int first_failure_ = -1;       // index into workers_
  int stop_signal_ = 0;          // signal received by the launcher
  bool stopping_ = false;
  Clock::time_point kill_at_;    // when still-running workers get SIGKILL
  bool killed_ = false;
};

void Supervisor::spawn(Worker& w) {
  std::map<std::string, std::string> base;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) base.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  std::vector<std::string> env = worker_env(o_, w.local_rank, base, w.error_file);
  std::vector<std::string> argv = o_.worker_argv;
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  int out[2], err[2];
  VLM_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0,
            "vlmtrain launch: pipe2 failed: ", std::strerror(errno));
  const pid_t parent = ::getpid();
  // Signals stay blocked across fork until the child has dropped the launcher's handlers
  // (else a SIGTERM sent to a just-forked worker would run our handler in the child).
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to exec.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the launcher's death takes the worker with it
    if (::getppid() != parent) ::_exit(127);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::sigaction(s, &dfl, nullptr);
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execvpe(cargv[0], cargv.data(), cenv.data());
    const char* msg = "vlmtrain launch: cannot execute the worker program: ";
    (void)!::write(2, msg, std::strlen(msg));
    (void)!::write(2, cargv[0], std::strlen(cargv[0]));
    (void)!::write(2, ": ", 2);
    const char* why = std::strerror(errno);
    (void)!::write(2, why, std::strlen(why));
    (void)!::write(2, "\n", 1);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  VLM_CHECK(pid >= 0, "vlmtrain launch: fork failed for rank ", w.rank, ": ",
            std::strerror(fork_errno));
  ::setpgid(pid, pid);  // also here, so signals to the group work before the child runs
  ::close(out[1]);
  ::close(err[1]);
  w.pid = pid;
  w.running = true;
  w.out = Stream{out[0], 1, ""};
  w.err = Stream{err[0], 2, ""};
}

void Supervisor::emit_lines(Worker& w, Stream& s, bool flush_all) {
  const std::string prefix = str("[rank ", w.rank, "] ");
  std::string chunk;
  size_t start = 0;
  for (;;) {
    size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    chunk += prefix;
    chunk.append(s.pending, start, nl + 1 - start);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (flush_all && !s.pending.empty()) {
    chunk += prefix + s.pending + "\n";
    s.pending.clear();
  }
  if (!chunk.empty()) write_all(s.to_fd, chunk);
}

void Supervisor::close_stream(Worker& w, Stream& s) {
  emit_lines(w, s, true);
  ::close(s.fd);
  s.fd = -1;
}

void Supervisor::pump(Worker& w, Stream& s) {
  char buf[65536];
  ssize_t n = ::read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    close_stream(w, s);
    return;
  }
  if (w.log_fd >= 0) write_all(w.log_fd, std::string(buf, n));
  s.pending.append(buf, n);
  emit_lines(w, s, false);
}

void Supervisor::signal_all(int sig, bool mark) {
  for (auto& w : workers_) {
    if (!w.running) continue;
    ::kill(-w.pid, sig);  // the worker's process group: the worker and its children
    if (mark) w.stopped_by_us = true;
  }
}

void Supervisor::reap() {
  // Reaped in one pass, a worker that died of a signal is more likely the cause than one
  // that exited with an error a moment later (e.g. a peer seeing the connection close).
  std::vector<int> newly_failed;
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    if (!w.running) continue;
    int status = 0;
    pid_t got = ::waitpid(w.pid, &status, WNOHANG);
    if (got != w.pid) continue;
    w.running = false;
    w.status = status;
    w.exit_s = now_s();
    if (failed(status) && !w.stopped_by_us) newly_failed.push_back(static_cast<int>(i));
  }
  if (newly_failed.empty() || first_failure_ >= 0 || stop_signal_ != 0) return;
  int pick = newly_failed[0];
  for (int i : newly_failed)
    if (WIFSIGNALED(workers_[i].status) && !WIFSIGNALED(workers_[pick].status)) pick = i;
  first_failure_ = pick;
  const Worker& f = workers_[pick];
  say(str("rank ", f.rank, " (pid ", f.pid, ") failed after ", seconds(f.exit_s), ": ",
          describe_status(f.status), "; stopping the other workers (SIGTERM, SIGKILL after ",
          o_.grace.count() / 1000.0, " s)"));
  stopping_ = true;
  kill_at_ = Clock::now() + o_.grace;
  signal_all(SIGTERM, true);
}

// Each local worker's ranks, error file (removed if left over) and log file.
void Supervisor::prepare_workers() {
  workers_.resize(o_.nproc_per_node);
  for (int l = 0; l < o_.nproc_per_node; ++l) {
    Worker& w = workers_[l];
    w.local_rank = l;
    w.rank = o_.node_rank * o_.nproc_per_node + l;
    w.error_file = str(dir_, "/rank", w.rank, ".error.json");
    std::error_code ec;
    fs::remove(w.error_file, ec);
    if (!o_.log_dir.empty()) {
      const std::string log = str(dir_, "/rank", w.rank, ".log");
      w.log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      VLM_CHECK(w.log_fd >= 0, "vlmtrain launch: cannot write ", log, ": ", std::strerror(errno),
                " (hint: check --log-dir)");
    }
  }
}

// Every worker, or none: a failed spawn kills and reaps the ones already started.
void Supervisor::start_workers() {
  const int world = o_.nnodes * o_.nproc_per_node;
  say(str("starting ", o_.nproc_per_node, " worker(s): ranks ", workers_.front().rank, "..",
          workers_.back().rank, " of ", world, " (node ", o_.node_rank, " of ", o_.nnodes,
          "), master ", o_.master_addr, ":", o_.master_port, ", error files in ", dir_));
  try {
    for (auto& w : workers_) spawn(w);
  } catch (...) {
    signal_all(SIGKILL, true);
    for (auto& w : workers_)
      if (w.running) ::waitpid(w.pid, nullptr, 0);
    throw;
  }
}

// Signals the launcher received: the first is forwarded to the workers (SIGKILL after the
// grace period), a second one kills them at once. SIGCHLD only wakes the loop.
void Supervisor::on_signals(int fd) {
  char sigs[64];
  ssize_t k;
  while ((k = ::read(fd, sigs, sizeof sigs)) > 0) {
    for (ssize_t j = 0; j < k; ++j) {
      const int sig = sigs[j];
      if (sig == SIGCHLD) continue;
      if (stop_signal_ == 0) {
        stop_signal_ = sig;
        say(str("received ", signal_name(sig), ", forwarding it to the workers (SIGKILL after ",
                o_.grace.count() / 1000.0, " s)"));
        stopping_ = true;
        kill_at_ = Clock::now() + o_.grace;
        signal_all(sig, true);
      } else {
        say(str("received ", signal_name(sig), " again: killing the workers"));
        kill_at_ = Clock::now();
      }
    }
  }
}

// One round of the loop: wait up to 100 ms for output or a signal, copy output lines.
void Supervisor::poll_once(int signal_fd) {
  std::vector<pollfd> fds{{signal_fd, POLLIN, 0}};
  std::vector<std::pair<Worker*, Stream*>> owners{{nullptr, nullptr}};
  for (auto& w : workers_) {
    for (Stream* s : {&w.out, &w.err}) {
      if (s->fd < 0) continue;
      fds.push_back({s->fd, POLLIN, 0});
      owners.push_back({&w, s});
    }
  }
  const int n = ::poll(fds.data(), fds.size(), 100);
  if (n < 0 && errno != EINTR) throw vlm::Error(str("vlmtrain launch: poll failed: ", std::strerror(errno)));
  if (n <= 0) return;
  if (fds[0].revents & POLLIN) on_signals(signal_fd);
  for (size_t j = 1; j < fds.size(); ++j)
    if (fds[j].revents & (POLLIN | POLLHUP | POLLERR)) pump(*owners[j].first, *owners[j].second);
}

// Poll, reap and enforce the grace period until every worker has exited and its output
// is read (or, when a worker's child still holds a pipe, 2 s after the last exit).
void Supervisor::supervise(int signal_fd) {
  std::optional<Clock::time_point> drain_until;
  for (;;) {
    poll_once(signal_fd);
    reap();
    bool any_running = false;
    for (auto& w : workers_) any_running = any_running || w.running;
    if (stopping_ && any_running && !killed_ && Clock::now() >= kill_at_) {
      for (auto& w : workers_)
        if (w.running) say(str("rank ", w.rank, " did not stop within the grace period: SIGKILL"));
      signal_all(SIGKILL, true);
      killed_ = true;
    }
    if (any_running) continue;
    bool open = false;
    for (auto& w : workers_) open = open || w.out.fd >= 0 || w.err.fd >= 0;
    if (!open) return;
    if (!drain_until) drain_until = Clock::now() + std::chrono::seconds(2);
    if (Clock::now() >= *drain_until) {
      for (auto& w : workers_) {
        if (w.out.fd >= 0) close_stream(w, w.out);
        if (w.err.fd >= 0) close_stream(w, w.err);
      }
      return;
    }
  }
}

// The launcher's exit code: 128 + signal when stopped by one, 0 when every worker
// succeeded, else 1 after a report on the first failure (its error file) and the others.
int Supervisor::verdict() {
  if (stop_signal_ != 0) {
    say(str("stopped by ", signal_name(stop_signal_), "; workers: ", [&] {
      std::string s;
      for (auto& w : workers_) s += str(s.empty() ? "" : ", ", "rank ", w.rank, " ", describe_status(w.status));
      return s;
    }()));
    return 128 + stop_signal_;
  }
  if (first_failure_ < 0) return 0;
  const Worker& f = workers_[first_failure_];
  std::string msg = str("worker failed: rank ", f.rank, " (local rank ", f.local_rank, ", node ",
                        o_.node_rank, ", pid ", f.pid, ") ", describe_status(f.status), " after ",
                        seconds(f.exit_s), "\n");
  const std::string error = read_error_message(f.error_file);
  if (!error.empty()) {
    msg += str("  its error (", f.error_file, "):\n", indent(error, "    "));
  } else {
    msg += str("  it wrote no error file",
               WIFSIGNALED(f.status) ? " (it was killed before it could)" : "", "\n");
  }
  for (auto& w : workers_) {
    if (&w == &f) continue;
    msg += str("  rank ", w.rank, ": ", describe_status(w.status), " after ", seconds(w.exit_s),
               w.stopped_by_us && WIFSIGNALED(w.status) ? " (stopped by the launcher)" : "", "\n");
  }
  msg += "  hint: the first failure is usually the cause; the others were stopped or failed "
         "because of it\n";
  write_all(2, "vlmtrain launch: " + msg);
  return 1;
}

int Supervisor::run() {
  SignalGuard guard;
  prepare_workers();
  start_workers();
  supervise(guard.read_fd());
  for (auto& w : workers_)
    if (w.log_fd >= 0) ::close(w.log_fd);
  return verdict();
}

}  // namespace

int run_launcher(const LaunchOptions& o) {
  VLM_CHECK(!o.worker_argv.empty(), "vlmtrain launch: no worker command");
  LaunchOptions opts = o;
  if (opts.master_port == 0) {
    VLM_CHECK(opts.nnodes == 1, "vlmtrain launch: --master-port is required with --nnodes > 1");
    opts.master_port = pick_free_port();
  }
  std::string dir;
  bool temp = false;
  if (!opts.log_dir.empty()) {
    std::error_code ec;
    fs::create_directories(opts.log_dir, ec);
    VLM_CHECK(!ec, "vlmtrain launch: cannot create --log-dir ", opts.log_dir, ": ", ec.message());
    dir = fs::absolute(opts.log_dir).string();
  } else {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = str(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/vlmtrain-launch-XXXXXX");
    VLM_CHECK(::mkdtemp(templ.data()) != nullptr, "vlmtrain launch: cannot create a directory for ",
              "the error files (", templ, "): ", std::strerror(errno), " (hint: set TMPDIR or --log-dir)");
    dir = templ;
    temp = true;
  }
  Supervisor sup(opts, dir);
  int code = sup.run();
  if (temp) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return code;
}

}  // namespace vlm::app
