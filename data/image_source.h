// Where an image's bytes come from: a file path, or base64 text inside the dataset file
// (ms-swift writes images as `data:image/png;base64,...` data URIs or as raw base64).
//
// Classification follows ms-swift's load_file: a string starting with "data:" is a data URI
// (only ";base64," payloads are accepted); a string longer than 200 characters made only of
// base64 characters is raw base64; anything else is a path. Embedded images are not copied
// into memory for the whole run: the dataset scan records where their base64 text lies in
// the dataset file (byte offset and length) and the loader re-reads that range when the
// image is needed; only text that cannot be located verbatim (JSON-escaped "\/") is kept.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vlm::data {

struct ImageRef;

enum class ImageSourceKind { kPath, kDataUri, kBase64 };

// Kind of an image string from a record (no filesystem access).
ImageSourceKind classify_image_source(const std::string& s);

// The base64 payload of a data URI or raw base64 string; throws vlm::Error for a data URI
// that is not base64 ("data:image/png,..." or no comma).
std::string base64_payload(const std::string& s);

// Decodes standard or URL-safe base64 (padding optional, ASCII whitespace ignored); throws
// vlm::Error naming the first invalid character and its position.
std::vector<uint8_t> decode_base64(const char* data, size_t size);
inline std::vector<uint8_t> decode_base64(const std::string& s) { return decode_base64(s.data(), s.size()); }

// Encodes bytes as standard padded base64 (tests, and for writing swift-style datasets).
std::string encode_base64(const std::vector<uint8_t>& bytes);

// The bytes of a record's image: the file at ref.path, or the decoded embedded base64
// (re-read from the dataset file when located there). Throws vlm::Error.
std::vector<uint8_t> read_image_bytes(const ImageRef& ref);

}  // namespace vlm::data
