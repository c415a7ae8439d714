// How one c10d process group is made (contract in process_group.h).
#include "sharding/dist/process_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL  // defined by TorchConfig for LibTorch builds with NCCL (the PyPI wheel)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

namespace vlm::sharding {

namespace {

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// The local address this host would use to reach host:port (a UDP connect() sends no
// packet, it only picks the route), e.g. "10.0.0.5"; "" when the host does not resolve or
// there is no route. On the master's own node it is the master address itself.
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return "";
  std::string found;
  for (addrinfo* a = res; a != nullptr && found.empty(); a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {0};
      const void* src = local.ss_family == AF_INET
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, src, buf, sizeof buf) != nullptr) found = buf;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return found;
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_gloo_group(const DistEnv& env, const ParallelOptions& opts,
                                                  const c10::intrusive_ptr<c10d::Store>& store,
                                                  const std::string& who, const std::string& where,
                                                  int rank, int size) {
  auto o = c10d::ProcessGroupGloo::Options::create(opts.timeout);
  if (!env.gloo_ifname.empty()) {
    o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(env.gloo_ifname));
  } else if (is_loopback(env.master_addr)) {
    o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    // Gloo's default device binds to the address this host's name resolves to, which is
    // a loopback address on many machines (Debian maps the hostname to 127.0.1.1): peers on
    // other nodes could not connect. Bind where the route to the master leaves instead.
    const std::string local = local_address_towards(env.master_addr, env.master_port);
    if (!local.empty())
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local));
    else
      o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  o->threads = 2;
  return wrap(str(who, ": Gloo rendezvous through ", where, " did not complete within ",
                  opts.timeout.count() / 1000.0, " s"),
              "did every rank start, with the same WORLD_SIZE and MASTER_ADDR/PORT?", [&] {
                return c10::intrusive_ptr<c10d::Backend>(
                    c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, o));
              });
}

std::vector<std::string> apply_nccl_env_defaults() {
  std::vector<std::string> set;
  for (const auto& [name, value] : std::vector<std::pair<const char*, const char*>>{
           {"TORCH_NCCL_AVOID_RECORD_STREAMS", "1"}}) {
    if (std::getenv(name) != nullptr) continue;  // the user's choice stands
    ::setenv(name, value, /*overwrite=*/0);
    set.push_back(str(name, "=", value));
  }
  return set;
}

c10::intrusive_ptr<c10d::Backend> make_nccl_group(const DistEnv& env, const ParallelOptions& opts,
                                                  const c10::intrusive_ptr<c10d::Store>& store,
                                                  const std::string& who, int rank, int size) {
#ifdef USE_C10D_NCCL
  apply_nccl_env_defaults();  // read by ProcessGroupNCCL's constructor
  auto o = c10d::ProcessGroupNCCL::Options::create();
  // Our watchdog (ParallelDims::start_watchdog) reports a stuck op at opts.timeout with the
  // comm layer's report; NCCL's own watchdog, a minute later, is the backstop.
  o->timeout = opts.timeout + std::chrono::seconds(60);
  return wrap(str(who, ": NCCL process group"), "check NCCL_DEBUG=INFO output", [&] {
    return c10::intrusive_ptr<c10d::Backend>(
        c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o));
  });
#else
  (void)env, (void)opts, (void)store, (void)rank, (void)size;
  throw Error(str(who, ": device is CUDA but the LibTorch this vlmtrain was built against has no "
                  "NCCL (hint: build against the PyPI wheel torch==2.11.0, or use device = \"cpu\")"));
#endif
}


}  // namespace vlm::sharding
