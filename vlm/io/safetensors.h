// safetensors: the tensor file format of HF checkpoints (read with mmap, write atomically).
//
// Layout of a file:
//   [8 bytes: N, little-endian u64] [N bytes: UTF-8 JSON header] [data section]
//   header = { "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end)},
//              ..., "__metadata__": {"<key>": "<string>"} (optional) }
//   offsets are relative to the data section, sorted, start at 0, contiguous, and the data
//   section ends exactly at the end of the file.
//
// Reading validates every rule a safe reader checks (listed above) and names the
// file and the broken rule. Tensors whose bytes are suitably aligned come back as zero-copy
// views into the mapping (the mapping stays alive as long as any view does); the mapping is
// private copy-on-write, so writing into a view never changes the file.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace vlm {

// ---------------------------------------------------------------- dtypes
// Supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
// "F32" -> torch::kFloat; throws vlm::Error naming the supported set for anything else.
torch::ScalarType st_dtype_from_name(const std::string& name);
// torch::kFloat -> "F32"; throws for dtypes safetensors (as read here) does not support.
std::string st_dtype_name(torch::ScalarType dtype);
// Bytes per element (BOOL: 1).
size_t st_dtype_size(torch::ScalarType dtype);

// ---------------------------------------------------------------- header
// One tensor entry of a validated header.
struct StTensorInfo {
  std::string name;
  torch::ScalarType dtype = torch::kFloat;
  std::vector<int64_t> shape;  // may be empty (0-d) or contain 0 (zero elements)
  uint64_t begin = 0;          // byte offsets into the data section, [begin, end)
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

// A validated header: tensors sorted by data offset, plus metadata.
struct StHeader {
  std::vector<StTensorInfo> tensors;           // in data order (by begin)
  std::map<std::string, std::string> metadata; // "__metadata__", empty when absent
  uint64_t header_len = 0;                     // N
  uint64_t data_offset = 0;                    // 8 + N: file offset of the data section
  uint64_t data_len = 0;                       // bytes of the data section
};

// Largest header accepted (same bound as the reference Rust implementation).
constexpr uint64_t kStMaxHeaderLen = 100'000'000;

// Validates a complete safetensors image held in memory (file bytes [0, size)).
// `source` names it in error messages (a path or "<buffer>"). Pure: no I/O, no torch
// allocation; safe to drive from a fuzzer. Throws vlm::Error on any violation.
StHeader parse_safetensors(const void* data, size_t size, const std::string& source);

// ---------------------------------------------------------------- reader
// An opened, validated safetensors file (or in-memory image). Cheap to copy (shared).
// Immutable after open: get() may be called from several threads at once.
class SafetensorsFile {
 public:
  // Maps `path` read-only (private copy-on-write) and validates it.
  static SafetensorsFile open(const std::string& path);
  // Takes ownership of an in-memory image and validates it (same checks as open()).
  static SafetensorsFile from_bytes(std::string bytes, const std::string& source = "<buffer>");

  const std::string& source() const;
  const StHeader& header() const;
  const std::map<std::string, std::string>& metadata() const { return header().metadata; }
  const std::vector<StTensorInfo>& tensors() const { return header().tensors; }
  std::vector<std::string> names() const;  // in data order
  bool contains(const std::string& name) const;
  // Throws vlm::Error naming the file when `name` is absent.
  const StTensorInfo& info(const std::string& name) const;

  // The tensor in its stored dtype, on CPU. A zero-copy view into the mapping when its
  // bytes are aligned to the element size (always true for files written by HF or by
  // save_safetensors), otherwise a private copy. Views keep the mapping alive.
  torch::Tensor get(const std::string& name) const;
  // Same, converted to `dtype` (a copy unless dtype matches the stored one).
  torch::Tensor get(const std::string& name, torch::ScalarType dtype) const;
  // Flat elements [lo, hi) of the tensor (row-major), stored dtype, on CPU: [hi - lo]. Only
  // those bytes are touched (a zero-copy view when aligned, else a copy of the range alone).
  // Throws vlm::Error naming the file when the range is outside [0, numel].
  torch::Tensor get_range(const std::string& name, int64_t lo, int64_t hi) const;

  // Drops the mapped pages this process has touched (madvise MADV_DONTNEED on the private
  // read-only mapping): they leave its RSS and are read again from the page cache if used.
  // Only for readers that copy what they read (no view returned by get() may be in use
  // when its pages must stay; views stay valid, their data is re-read). No-op in memory.
  void drop_resident_pages() const;

  // Zero-copy introspection: whether `ptr` lies inside this file's mapped bytes.
  bool owns_pointer(const void* ptr) const;
  // Total bytes of the mapped image (file size).
  size_t mapped_size() const;

 private:
  struct State;
  explicit SafetensorsFile(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// ---------------------------------------------------------------- writer
struct SafetensorsWriteOptions {
  // Floating-point tensors are converted to this dtype while writing (integer and bool
  // tensors keep theirs). Unset: every tensor keeps its dtype.
  std::optional<torch::ScalarType> float_dtype;
  // Written as "__metadata__" (omitted when empty).
  std::map<std::string, std::string> metadata;
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Header JSON text for `tensors` (data in the writer's order, see below), padded with spaces so that
// 8 + N is a multiple of 8. Used by the writer; exposed for tests and size estimates.
std::string safetensors_header(const NamedTensors& tensors, const SafetensorsWriteOptions& opts);

// Writes `tensors` to `path` atomically: a temp file beside it, fsync, rename, fsync of the
// directory. Data is laid out by element size, largest first (stable otherwise), so every
// tensor starts aligned to its element size and reads back zero-copy. Each tensor is moved
// to CPU, converted and made contiguous one at a time (no copy of the whole set in
// memory). Names must be unique,
// non-empty, without NUL, and not "__metadata__". Throws vlm::Error naming the path.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const SafetensorsWriteOptions& opts = {});

// The complete file image in memory (same bytes save_safetensors writes).
std::string serialize_safetensors(const NamedTensors& tensors,
                                  const SafetensorsWriteOptions& opts = {});

}  // namespace vlm
