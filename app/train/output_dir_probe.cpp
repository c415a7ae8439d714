// The start-up check of run.output_dir (contract in output_dir_probe.h).
#include "app/train/output_dir_probe.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "sharding/dist/comm.h"
#include "vlm/runtime/check.h"

namespace fs = std::filesystem;

namespace vlm::app {
namespace {

constexpr int64_t kProbeHostChars = 64;  // host names are cut to this many bytes

std::string probe_host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

std::string probe_text(uint64_t nonce) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "vlmtrain output_dir probe %016llx\n", static_cast<unsigned long long>(nonce));
  return buf;
}

std::string probe_path(const std::string& dir, uint64_t nonce) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), ".vlmtrain-probe-%016llx", static_cast<unsigned long long>(nonce));
  return (fs::path(dir) / buf).string();
}

// Rank 0: creates `dir` if needed and writes the probe file (fsynced). "" or the error.
std::string write_probe(const std::string& dir, uint64_t nonce) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return vlm::str("cannot create it: ", ec.message());
  const std::string path = probe_path(dir, nonce);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out.good()) return vlm::str("cannot create ", path, " (permissions? a read-only or full filesystem?)");
    out << probe_text(nonce);
    out.flush();
    if (!out.good()) return vlm::str("writing ", path, " failed (a full filesystem?)");
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  return "";
}

bool sees_probe(const std::string& dir, uint64_t nonce) {
  const std::string path = probe_path(dir, nonce);
  for (int attempt = 0; attempt < 10; ++attempt) {
    std::ifstream in(path, std::ios::binary);
    if (in.good()) {
      std::stringstream ss;
      ss << in.rdbuf();
      if (ss.str() == probe_text(nonce)) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

// "1, 3-5, 8" for sorted ranks.
std::string rank_ranges(const std::vector<int64_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

void check_output_dir_shared(const std::string& dir, vlm::sharding::Comm& comm) {
  const int64_t world = comm.world_size(), rank = comm.rank();
  if (world == 1) return;

  // 1-2. Rank 0 writes the probe; the broadcast of (nonce, written) is the barrier after it.
  uint64_t nonce = 0;
  std::string write_error;
  if (rank == 0) {
    std::random_device rd;
    nonce = ((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
             static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())) >>
            2;  // 62 bits: a positive int64
    write_error = write_probe(dir, nonce);
  }
  torch::Tensor head = torch::tensor({static_cast<int64_t>(nonce), write_error.empty() ? int64_t{1} : int64_t{0}},
                                     torch::kInt64);
  comm.broadcast(head, 0, "run.output_dir probe: rank 0's probe file");
  nonce = static_cast<uint64_t>(head[0].item<int64_t>());
  VLM_CHECK(head[1].item<int64_t>() == 1, "run.output_dir = ", dir, ": rank 0 cannot write into it: ",
            rank == 0 ? write_error : std::string("see rank 0's error"),
            " (hint: run.output_dir must be a writable directory on a filesystem that every node mounts)");

  // 3-4. Every rank looks; an all-gather of (seen, host) lets every rank decide the same.
  const bool seen = sees_probe(dir, nonce);
  const std::string host = probe_host_name();
  torch::Tensor mine = torch::zeros({1 + kProbeHostChars}, torch::kInt64);
  mine[0] = seen ? 1 : 0;
  for (int64_t i = 0; i < kProbeHostChars && i < static_cast<int64_t>(host.size()); ++i)
    mine[1 + i] = static_cast<int64_t>(static_cast<unsigned char>(host[static_cast<size_t>(i)]));
  torch::Tensor all = torch::zeros({world * (1 + kProbeHostChars)}, torch::kInt64);
  comm.all_gather(all, mine, "run.output_dir probe: who sees it");

  // 5. Every rank has looked: rank 0 removes the probe.
  if (rank == 0) {
    std::error_code ec;
    fs::remove(probe_path(dir, nonce), ec);
  }

  std::map<std::string, std::vector<int64_t>> missing;  // host -> ranks that cannot see the probe
  std::string host0;
  const torch::Tensor table = all.view({world, 1 + kProbeHostChars});
  auto acc = table.accessor<int64_t, 2>();
  for (int64_t r = 0; r < world; ++r) {
    std::string h;
    for (int64_t i = 1; i <= kProbeHostChars && acc[r][i] != 0; ++i) h += static_cast<char>(acc[r][i]);
    if (r == 0) host0 = h;
    if (acc[r][0] == 0) missing[h].push_back(r);
  }
  if (missing.empty()) return;
  std::string who;
  for (const auto& [h, ranks] : missing)
    who += vlm::str(who.empty() ? "" : "; ", ranks.size() == 1 ? "rank " : "ranks ", rank_ranges(ranks), " on host ",
                    h);
  throw vlm::Error(vlm::str(
      "run.output_dir = ", dir, " is not one directory shared by every rank: rank 0 (host ", host0,
      ") wrote a probe file into it and ", who,
      " cannot see it (node-local disks?). Every rank writes its part of each checkpoint there and reads all parts "
      "on resume, so it must be on a filesystem that every node mounts at the same path; writing checkpoints per "
      "node is not supported. Hint: set run.output_dir to a shared filesystem path (NFS, Lustre, ...), e.g. "
      "--set run.output_dir=/shared/runs/NAME"));
}

}  // namespace vlm::app
