// TensorBoard event files: CRC-32C, TFRecord framing, hand-encoded Event protos, the writer.
#include "app/report/tensorboard.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace fs = std::filesystem;

namespace vlm::app {

// ---------------------------------------------------------------- CRC-32C

namespace {

std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// ---------------------------------------------------------------- protobuf wire format

namespace {

// Wire types of the proto encoding.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_key(std::string& out, uint32_t field, uint32_t wire) { put_varint(out, (uint64_t{field} << 3) | wire); }

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_le(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_le(out, bits, 4);
}

void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(v));  // negative: 10 bytes, as protobuf does
}

void put_bytes(std::string& out, uint32_t field, std::string_view v) {
  put_key(out, field, kBytes);
  put_varint(out, v.size());
  out.append(v.data(), v.size());
}

// Event (event.proto) field numbers.
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5,
                   kEventSessionLog = 7;
// SessionLog.status = 1; SessionStatus.START = 1.
constexpr uint32_t kSessionLogStatus = 1;
constexpr int64_t kSessionStart = 1;
// Summary.value = 1 (repeated Value); Value.tag = 1, Value.simple_value = 2.
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2;

std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_double(e, kEventWallTime, wall_time);
  put_int64(e, kEventStep, step);
  return e;
}

}  // namespace

std::string tfrecord(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  put_le(out, payload.size(), 8);
  put_le(out, mask_crc32c(crc32c(out.data(), 8)), 4);
  out.append(payload.data(), payload.size());
  put_le(out, mask_crc32c(crc32c(payload.data(), payload.size())), 4);
  return out;
}

std::string event_file_version(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, kEventFileVersion, "brain.Event:2");
  return e;
}

std::string event_session_start(double wall_time, int64_t step) {
  std::string log;
  put_int64(log, kSessionLogStatus, kSessionStart);
  std::string e = event_head(wall_time, step);
  put_bytes(e, kEventSessionLog, log);
  return e;
}

std::string event_scalars(double wall_time, int64_t step, const std::vector<TbScalar>& values) {
  std::string summary;
  for (const TbScalar& s : values) {
    std::string v;
    put_bytes(v, kValueTag, s.tag);
    put_float(v, kValueSimpleValue, s.value);
    put_bytes(summary, kSummaryValue, v);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, kEventSummary, summary);
  return e;
}

std::vector<TbScalar> tb_scalars_from_metrics(const nlohmann::json& line) {
  std::vector<TbScalar> out;
  if (!line.is_object()) return out;
  for (const auto& [key, v] : line.items()) {
    if (key == "step" || key == "eval_full") continue;
    float value;
    if (v.is_boolean()) value = v.get<bool>() ? 1.0f : 0.0f;
    else if (v.is_number()) value = static_cast<float>(v.get<double>());
    else continue;
    out.push_back({key.find('/') == std::string::npos ? "train/" + key : key, value});
  }
  return out;
}

// ---------------------------------------------------------------- writer

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Unix seconds for a new file's name: now, or one past the newest events file already in
// `dir`, so that names sort in start order even when two processes start in one second.
int64_t file_seconds(const fs::path& dir) {
  int64_t secs = static_cast<int64_t>(wall_seconds());
  const std::string prefix = "events.out.tfevents.";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t end = name.find('.', prefix.size());
    const std::string digits = name.substr(prefix.size(), end - prefix.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    secs = std::max<int64_t>(secs, std::stoll(digits) + 1);
  }
  return secs;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string h = buf;
  for (char& c : h)
    if (c == '/') c = '_';
  return h;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(std::string dir, int64_t first_step) {
  if (dir.empty()) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    spdlog::warn("tensorboard: cannot create {} ({}); no TensorBoard events this run", dir, ec.message());
    return;
  }
  path_ = (fs::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}.vlmtrain", file_seconds(dir), host_name(),
                                        static_cast<long>(getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) {
    spdlog::warn("tensorboard: cannot open {} ({}); no TensorBoard events this run", path_, std::strerror(errno));
    path_.clear();
    return;
  }
  const double now = wall_seconds();
  append(event_file_version(now));
  append(event_session_start(now, first_step));
  if (file_ != nullptr && std::fflush(file_) != 0) fail("flush");
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write_metrics(const nlohmann::json& line) {
  if (file_ == nullptr || !line.is_object() || !line.contains("step") || !line.at("step").is_number_integer()) return;
  write(line.at("step").get<int64_t>(), tb_scalars_from_metrics(line));
}

void TensorBoardWriter::write(int64_t step, const std::vector<TbScalar>& values) {
  if (file_ == nullptr || values.empty()) return;
  append(event_scalars(wall_seconds(), step, values));
  if (file_ != nullptr && std::fflush(file_) != 0) fail("flush");
}

void TensorBoardWriter::append(const std::string& event) {
  if (file_ == nullptr) return;
  const std::string rec = tfrecord(event);
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size()) fail("write");
}

void TensorBoardWriter::fail(const std::string& what) {
  spdlog::warn("tensorboard: {} of {} failed ({}); no more TensorBoard events this run", what, path_,
               std::strerror(errno));
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace vlm::app
