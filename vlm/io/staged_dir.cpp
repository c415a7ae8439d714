// Directories written whole (see staged_dir.h).
#include "vlm/io/staged_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "vlm/runtime/check.h"

namespace fs = std::filesystem;

namespace vlm {

void write_file_synced(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  VLM_CHECK(fd >= 0, path, ": cannot create: ", std::strerror(errno));
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      throw Error(str(path, ": write failed: ", err, " (hint: disk full?)"));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  const bool ok = ::fsync(fd) == 0;
  const std::string err = std::strerror(errno);
  ::close(fd);
  VLM_CHECK(ok, path, ": fsync failed: ", err);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort
  ::fsync(fd);
  ::close(fd);
}

StagedDir::StagedDir(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  target_ = fs::path(dir).lexically_normal();
  if (target_.filename().empty()) target_ = target_.parent_path();  // "out/" -> "out"
  existed_ = fs::exists(target_, ec);
  VLM_CHECK(!existed_ || fs::is_directory(target_, ec), dir, ": exists and is not a directory");
  parent_ = target_.has_parent_path() ? target_.parent_path() : fs::path(".");
  fs::create_directories(parent_, ec);
  VLM_CHECK(!ec, parent_.string(), ": cannot create directory: ", ec.message());
  suffix_ = str(::getpid(), "-", std::chrono::steady_clock::now().time_since_epoch().count());
  tmp_ = parent_ / ("." + target_.filename().string() + ".tmp-" + suffix_);
  VLM_CHECK(fs::create_directory(tmp_, ec) && !ec, tmp_.string(), ": cannot create temp directory: ", ec.message());
}

StagedDir::~StagedDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void StagedDir::commit() {
  VLM_ASSERT(!committed_, "StagedDir::commit twice");
  fsync_dir(tmp_.string());
  std::error_code ec;
  if (fs::exists(target_, ec)) {
    // Atomic exchange where the filesystem has it; else move the old one aside first.
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_all(tmp_, ec);  // now the old directory
    } else {
      const fs::path old = parent_ / ("." + target_.filename().string() + ".old-" + suffix_);
      fs::rename(target_, old, ec);
      VLM_CHECK(!ec, dir_, ": cannot move the existing directory aside: ", ec.message());
      fs::rename(tmp_, target_, ec);
      if (ec) {
        std::error_code ec2;
        fs::rename(old, target_, ec2);  // put the old one back
        throw Error(str(dir_, ": cannot rename ", tmp_.string(), " into place: ", ec.message()));
      }
      fs::remove_all(old, ec);
    }
  } else {
    fs::rename(tmp_, target_, ec);
    VLM_CHECK(!ec, dir_, ": cannot rename ", tmp_.string(), " into place: ", ec.message());
  }
  committed_ = true;
  fsync_dir(parent_.string());
}

}  // namespace vlm
