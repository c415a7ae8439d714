#include "vlm/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <set>
#include <unordered_map>

#include "vlm/runtime/check.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O assumes a little-endian host (the file format is little-endian)");

namespace vlm {
namespace {

using json = nlohmann::json;

struct DtypeEntry {
  const char* name;
  torch::ScalarType type;
  size_t size;
};

constexpr DtypeEntry kDtypes[] = {
    {"F64", torch::kDouble, 8}, {"F32", torch::kFloat, 4},  {"F16", torch::kHalf, 2},
    {"BF16", torch::kBFloat16, 2}, {"I64", torch::kLong, 8}, {"I32", torch::kInt, 4},
    {"I16", torch::kShort, 2},  {"I8", torch::kChar, 1},    {"U8", torch::kByte, 1},
    {"BOOL", torch::kBool, 1},
};

constexpr const char* kSupported = "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL";

uint64_t read_le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // host is little-endian (static_assert above)
  return v;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A JSON number that must be a non-negative integer.
uint64_t json_u64(const json& v, const std::string& source, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer())
    throw Error(str(source, ": ", what, " must be a non-negative integer, found ", v.dump(),
                    " (hint: corrupt header)"));
  throw Error(str(source, ": ", what, " must be a non-negative integer, found ", v.dump(),
                  " (a JSON ", v.type_name(), ")"));
}

std::string errno_str() { return std::strerror(errno); }

}  // namespace

// ---------------------------------------------------------------- dtypes

torch::ScalarType st_dtype_from_name(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  throw Error(str("unsupported safetensors dtype \"", name, "\": expected one of ", kSupported));
}

std::string st_dtype_name(torch::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.type) return d.name;
  throw Error(str("dtype ", c10::toString(dtype), " cannot be stored in safetensors here: expected one of ",
                  kSupported, " (hint: convert the tensor first)"));
}

size_t st_dtype_size(torch::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.type) return d.size;
  throw Error(str("dtype ", c10::toString(dtype), " is not a safetensors dtype: expected one of ",
                  kSupported));
}

int64_t StTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // overflow excluded by parse_safetensors
  return n;
}

// ---------------------------------------------------------------- parsing

StHeader parse_safetensors(const void* data, size_t size, const std::string& source) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  VLM_CHECK(size >= 8, source, ": truncated file: expected at least 8 bytes for the header length, found ",
            size, " (hint: the file is empty or was cut off while copying)");
  StHeader h;
  h.header_len = read_le64(bytes);
  VLM_CHECK(h.header_len <= kStMaxHeaderLen, source, ": header length ", h.header_len,
            " exceeds the limit of ", kStMaxHeaderLen, " bytes (hint: not a safetensors file, or corrupt)");
  VLM_CHECK(8 + h.header_len <= size, source, ": header length ", h.header_len,
            " runs past the end of the file: expected 8 + ", h.header_len, " = ", 8 + h.header_len,
            " <= file size ", size, " (hint: the file is truncated)");
  h.data_offset = 8 + h.header_len;
  h.data_len = size - h.data_offset;

  // Parse the JSON header, detecting duplicate keys (nlohmann silently keeps the last one).
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  size_t duplicate_depth = 0;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (ev == json::parse_event_t::key && !open_objects.empty() && parsed.is_string()) {
      if (!open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
        duplicate_depth = open_objects.size();
      }
    }
    return true;
  };
  const char* hb = reinterpret_cast<const char*>(bytes + 8);
  json header;
  try {
    header = json::parse(hb, hb + h.header_len, cb, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    throw Error(str(source, ": header is not valid UTF-8 JSON: ", e.what(),
                    " (hint: not a safetensors file, or corrupt)"));
  }
  if (!duplicate.empty()) {
    if (duplicate_depth == 1)
      throw Error(str(source, ": duplicate tensor name \"", duplicate, "\" in header (each name must appear once)"));
    throw Error(str(source, ": duplicate key \"", duplicate, "\" inside a header entry"));
  }
  VLM_CHECK(header.is_object(), source, ": header must be a JSON object, found a JSON ", header.type_name());

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      VLM_CHECK(entry.is_object(), source, ": \"__metadata__\" must be an object of strings, found a JSON ",
                entry.type_name());
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        VLM_CHECK(m.value().is_string(), source, ": \"__metadata__\".\"", m.key(),
                  "\" must be a string, found a JSON ", m.value().type_name());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    VLM_CHECK(!name.empty(), source, ": empty tensor name in header");
    VLM_CHECK(name.find('\0') == std::string::npos, source, ": tensor name \"",
              name.substr(0, name.find('\0')), "\\u0000...\" contains a NUL character");
    const std::string what = str("tensor \"", name, "\"");
    VLM_CHECK(entry.is_object(), source, ": ", what, ": entry must be an object {dtype, shape, data_offsets}, found a JSON ",
              entry.type_name());
    for (const char* key : {"dtype", "shape", "data_offsets"})
      VLM_CHECK(entry.contains(key), source, ": ", what, ": missing \"", key, "\"");
    const json& jd = entry["dtype"];
    const json& js = entry["shape"];
    const json& jo = entry["data_offsets"];
    VLM_CHECK(jd.is_string(), source, ": ", what, ": \"dtype\" must be a string, found ", jd.dump());
    VLM_CHECK(js.is_array(), source, ": ", what, ": \"shape\" must be an array, found ", js.dump());
    VLM_CHECK(jo.is_array() && jo.size() == 2, source, ": ", what,
              ": \"data_offsets\" must be [begin, end], found ", jo.dump());

    StTensorInfo t;
    t.name = name;
    try {
      t.dtype = st_dtype_from_name(jd.get<std::string>());
    } catch (const Error& e) {
      throw Error(str(source, ": ", what, ": ", e.what()));
    }
    uint64_t numel = 1;
    for (const json& jdim : js) {
      uint64_t d = json_u64(jdim, source, what + " shape dimension");
      VLM_CHECK(d <= uint64_t(std::numeric_limits<int64_t>::max()), source, ": ", what,
                ": shape dimension ", d, " overflows int64");
      t.shape.push_back(int64_t(d));
      VLM_CHECK(!__builtin_mul_overflow(numel, d, &numel), source, ": ", what, ": shape ", js.dump(),
                " overflows: the element count does not fit in 64 bits");
    }
    VLM_CHECK(numel <= uint64_t(std::numeric_limits<int64_t>::max()), source, ": ", what,
              ": shape ", js.dump(), " overflows: ", numel, " elements do not fit in int64");
    uint64_t nbytes = 0;
    VLM_CHECK(!__builtin_mul_overflow(numel, uint64_t(st_dtype_size(t.dtype)), &nbytes), source, ": ",
              what, ": shape ", js.dump(), " x ", jd.get<std::string>(), " overflows 64-bit byte count");
    t.begin = json_u64(jo[0], source, what + " data_offsets[0]");
    t.end = json_u64(jo[1], source, what + " data_offsets[1]");
    VLM_CHECK(t.begin <= t.end, source, ": ", what, ": data_offsets [", t.begin, ", ", t.end,
              ") has begin > end");
    VLM_CHECK(t.end - t.begin == nbytes, source, ": ", what, ": size mismatch: shape ", shape_str(t.shape),
              " x ", jd.get<std::string>(), " (", st_dtype_size(t.dtype), " bytes) = ", nbytes,
              " bytes, but data_offsets [", t.begin, ", ", t.end, ") span ", t.end - t.begin, " bytes");
    h.tensors.push_back(std::move(t));
  }

  // Offsets: sorted, starting at 0, contiguous, ending exactly at the end of the file.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const StTensorInfo& a, const StTensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  std::string prev = "the start of the data section";
  for (const auto& t : h.tensors) {
    if (t.begin != expect) {
      const char* kind = t.begin < expect ? "overlaps the previous tensor" : "leaves a gap";
      throw Error(str(source, ": tensor \"", t.name, "\" data_offsets [", t.begin, ", ", t.end, ") ", kind,
                      ": expected it to begin at ", expect, " (right after ", prev,
                      "); offsets must start at 0 and be contiguous"));
    }
    expect = t.end;
    prev = str("\"", t.name, "\"");
  }
  VLM_CHECK(expect == h.data_len, source, ": data section is ", h.data_len, " bytes but the tensors cover ",
            expect, " bytes: ",
            expect < h.data_len ? "trailing bytes after the last tensor" : "the file is truncated",
            " (expected file size ", h.data_offset + expect, ", found ", size, ")");
  return h;
}

// ---------------------------------------------------------------- reader

struct SafetensorsFile::State {
  std::string source;
  // Either an mmap'ed file or an owned buffer.
  void* map = nullptr;
  size_t map_size = 0;
  std::string bytes;
  StHeader header;
  std::unordered_map<std::string, size_t> index;

  uint8_t* base() { return map ? static_cast<uint8_t*>(map) : reinterpret_cast<uint8_t*>(bytes.data()); }
  size_t size() const { return map ? map_size : bytes.size(); }
  ~State() {
    if (map) munmap(map, map_size);
  }
  void build_index() {
    for (size_t i = 0; i < header.tensors.size(); ++i) index.emplace(header.tensors[i].name, i);
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto st = std::make_shared<State>();
  st->source = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  VLM_CHECK(fd >= 0, path, ": cannot open safetensors file: ", errno_str());
  struct stat sb {};
  if (fstat(fd, &sb) != 0) {
    std::string err = errno_str();
    ::close(fd);
    throw Error(str(path, ": cannot stat: ", err));
  }
  if (!S_ISREG(sb.st_mode)) {
    ::close(fd);
    throw Error(str(path, ": not a regular file"));
  }
  size_t size = size_t(sb.st_size);
  if (size < 8) {
    ::close(fd);
    parse_safetensors("", size, path);  // throws the "truncated" error
  }
  // Private + writable: a write into a returned view copies the page, never touches the file.
  // MAP_NORESERVE: no swap is reserved for the (normally never written) private pages, so
  // mapping a shard larger than RAM + swap does not fail under heuristic overcommit.
  void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  std::string err = errno_str();
  ::close(fd);
  VLM_CHECK(m != MAP_FAILED, path, ": mmap of ", size, " bytes failed: ", err);
  st->map = m;
  st->map_size = size;
  st->header = parse_safetensors(st->base(), size, path);
  st->build_index();
  return SafetensorsFile(std::move(st));
}

SafetensorsFile SafetensorsFile::from_bytes(std::string bytes, const std::string& source) {
  auto st = std::make_shared<State>();
  st->source = source;
  st->bytes = std::move(bytes);
  st->header = parse_safetensors(st->bytes.data(), st->bytes.size(), source);
  st->build_index();
  return SafetensorsFile(std::move(st));
}

const std::string& SafetensorsFile::source() const { return state_->source; }
const StHeader& SafetensorsFile::header() const { return state_->header; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& t : state_->header.tensors) out.push_back(t.name);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const { return state_->index.count(name) != 0; }

const StTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = state_->index.find(name);
  VLM_CHECK(it != state_->index.end(), state_->source, ": no tensor named \"", name, "\" (the file holds ",
            state_->header.tensors.size(), " tensors)");
  return state_->header.tensors[it->second];
}

torch::Tensor SafetensorsFile::get(const std::string& name) const {
  const StTensorInfo& t = info(name);
  auto opts = torch::TensorOptions().dtype(t.dtype).device(torch::kCPU);
  if (t.numel() == 0) return torch::empty(t.shape, opts);
  uint8_t* p = state_->base() + state_->header.data_offset + t.begin;
  if (reinterpret_cast<uintptr_t>(p) % st_dtype_size(t.dtype) == 0) {
    std::shared_ptr<State> keep = state_;
    return torch::from_blob(p, t.shape, [keep](void*) {}, opts);
  }
  // Misaligned (a foreign writer without padding): copy to an aligned buffer.
  torch::Tensor out = torch::empty(t.shape, opts);
  std::memcpy(out.data_ptr(), p, t.nbytes());
  return out;
}

torch::Tensor SafetensorsFile::get(const std::string& name, torch::ScalarType dtype) const {
  torch::Tensor t = get(name);
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

torch::Tensor SafetensorsFile::get_range(const std::string& name, int64_t lo, int64_t hi) const {
  const StTensorInfo& t = info(name);
  VLM_CHECK(0 <= lo && lo <= hi && hi <= t.numel(), source(), ": tensor \"", name, "\": element range [", lo, ", ",
            hi, ") is outside its ", t.numel(), " elements");
  auto opts = torch::TensorOptions().dtype(t.dtype).device(torch::kCPU);
  if (lo == hi) return torch::empty({0}, opts);
  const size_t es = st_dtype_size(t.dtype);
  uint8_t* p = state_->base() + state_->header.data_offset + t.begin + static_cast<uint64_t>(lo) * es;
  if (reinterpret_cast<uintptr_t>(p) % es == 0) {
    std::shared_ptr<State> keep = state_;
    return torch::from_blob(p, {hi - lo}, [keep](void*) {}, opts);
  }
  torch::Tensor out = torch::empty({hi - lo}, opts);
  std::memcpy(out.data_ptr(), p, static_cast<size_t>(hi - lo) * es);
  return out;
}

void SafetensorsFile::drop_resident_pages() const {
  if (state_->map != nullptr) madvise(state_->map, state_->map_size, MADV_DONTNEED);
}

bool SafetensorsFile::owns_pointer(const void* ptr) const {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  auto b = reinterpret_cast<uintptr_t>(state_->base());
  return p >= b && p < b + state_->size();
}

size_t SafetensorsFile::mapped_size() const { return state_->size(); }

// ---------------------------------------------------------------- writer
namespace {

struct Planned {
  const std::string* name;
  const torch::Tensor* tensor;
  torch::ScalarType dtype;  // stored dtype
  uint64_t nbytes;
};

std::vector<Planned> plan_layout(const NamedTensors& tensors, const SafetensorsWriteOptions& opts) {
  std::vector<Planned> out;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    VLM_CHECK(!name.empty(), "safetensors writer: empty tensor name");
    VLM_CHECK(name.find('\0') == std::string::npos, "safetensors writer: tensor name contains NUL");
    VLM_CHECK(name != "__metadata__", "safetensors writer: \"__metadata__\" is reserved and cannot name a tensor");
    VLM_CHECK(seen.insert(name).second, "safetensors writer: duplicate tensor name \"", name, "\"");
    VLM_CHECK(t.defined(), "safetensors writer: tensor \"", name, "\" is undefined");
    torch::ScalarType dt = t.scalar_type();
    if (opts.float_dtype && at::isFloatingType(dt)) dt = *opts.float_dtype;
    size_t es = 0;
    try {
      st_dtype_name(dt);
      es = st_dtype_size(dt);
    } catch (const Error& e) {
      throw Error(str("safetensors writer: tensor \"", name, "\": ", e.what()));
    }
    out.push_back({&name, &t, dt, uint64_t(t.numel()) * es});
  }
  std::stable_sort(out.begin(), out.end(), [](const Planned& a, const Planned& b) {
    return st_dtype_size(a.dtype) > st_dtype_size(b.dtype);
  });
  return out;
}

std::string header_for(const std::vector<Planned>& plan, const SafetensorsWriteOptions& opts) {
  json h = json::object();
  uint64_t off = 0;
  for (const auto& p : plan) {
    json e = json::object();
    e["dtype"] = st_dtype_name(p.dtype);
    e["shape"] = p.tensor->sizes().vec();
    e["data_offsets"] = {off, off + p.nbytes};
    h[*p.name] = std::move(e);
    off += p.nbytes;
  }
  if (!opts.metadata.empty()) h["__metadata__"] = opts.metadata;
  std::string text;
  try {
    text = h.dump();
  } catch (const json::exception& e) {
    throw Error(str("safetensors writer: cannot encode the header (names must be valid UTF-8): ", e.what()));
  }
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  return text;
}

// The bytes of one tensor as stored: CPU, contiguous, stored dtype.
torch::Tensor stored_bytes(const Planned& p) {
  torch::Tensor t = p.tensor->detach();
  if (t.scalar_type() != p.dtype) t = t.to(p.dtype);
  return t.to(torch::kCPU).contiguous();
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, c, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    VLM_CHECK(w > 0, path, ": write failed: ", errno_str(), " (hint: disk full?)");
    c += w;
    n -= size_t(w);
  }
}

void fsync_parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse opening directories
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string safetensors_header(const NamedTensors& tensors, const SafetensorsWriteOptions& opts) {
  return header_for(plan_layout(tensors, opts), opts);
}

std::string serialize_safetensors(const NamedTensors& tensors, const SafetensorsWriteOptions& opts) {
  auto plan = plan_layout(tensors, opts);
  std::string header = header_for(plan, opts);
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  for (const auto& p : plan) {
    if (p.nbytes == 0) continue;
    torch::Tensor t = stored_bytes(p);
    out.append(static_cast<const char*>(t.data_ptr()), p.nbytes);
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsWriteOptions& opts) {
  auto plan = plan_layout(tensors, opts);
  std::string header = header_for(plan, opts);
  auto nanos = std::chrono::steady_clock::now().time_since_epoch().count();
  std::string tmp = str(path, ".tmp-", getpid(), "-", nanos);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  VLM_CHECK(fd >= 0, path, ": cannot create temp file ", tmp, ": ", errno_str());
  try {
    uint64_t n = header.size();
    write_all(fd, &n, 8, path);
    write_all(fd, header.data(), header.size(), path);
    for (const auto& p : plan) {
      if (p.nbytes == 0) continue;
      torch::Tensor t = stored_bytes(p);
      write_all(fd, t.data_ptr(), p.nbytes, path);
    }
    VLM_CHECK(::fsync(fd) == 0, path, ": fsync failed: ", errno_str());
    VLM_CHECK(::close(fd) == 0, path, ": close failed: ", errno_str());
    fd = -1;
    VLM_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, path, ": rename from ", tmp, " failed: ", errno_str());
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_parent_dir(path);
}

}  // namespace vlm
