// JSONL datasets: three record formats, image path resolution, image header probing
// (sizes known before decoding, cached beside the dataset), bad-record accounting.
//
// Formats (auto-detected per file from its first parseable line, or forced):
//   messages : {"messages":[{"role":"user","content":"<image>Read."},
//                           {"role":"assistant","content":"..."}], "images":["a.jpg"]}
//              (content may also be a list of {"type":"text","text":..} / {"type":"image"})
//   llava    : {"image":"a.jpg" | ["a.jpg",..], "conversations":[{"from":"human",
//               "value":"<image>\n..."},{"from":"gpt","value":"..."}]}
//   plain    : {"image":"a.png","text":"ground truth"[, "answers":[..]]}; the user turn is
//              the recipe's OCR prompt.
// A record keeps its conversation turns with "<image>" markers, its images (resolved path
// + oriented size) and its reference answers; chat rendering and tokenization happen
// later (sample building), so this file knows nothing about tokenizers.
//
// Bad records (skipped, each with file:line and reason; first few printed, all counted):
// invalid JSON, missing/invalid fields, marker count != image count, missing/unreadable
// image, zero-size image, aspect ratio > 200. Too many (> max_bad_fraction of the
// non-empty lines) is an error. Nothing is ever dropped silently.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "vlm/image_geometry.h"

namespace vlm::data {

enum class DatasetFormat { kAuto, kMessages, kLlava, kPlainOcr };
DatasetFormat parse_dataset_format(const std::string& name);  // auto|messages|llava|plain
std::string to_string(DatasetFormat f);

// The marker that stands for one image inside turn contents.
inline constexpr const char* kImageMarker = "<image>";

struct Turn {
  std::string role;      // "system" | "user" | "assistant"
  std::string content;   // text with one kImageMarker per image, in image order
};

struct ImageRef {
  std::string path;      // resolved path (image_root or the JSONL's folder applied)
  int64_t width = 0;     // oriented width (EXIF 5-8 swapped); 0 when not probed
  int64_t height = 0;
};

struct Record {
  std::string source;              // JSONL file
  int64_t line = 0;                // 1-based line in source
  DatasetFormat format = DatasetFormat::kAuto;
  std::vector<Turn> turns;
  std::vector<ImageRef> images;
  std::vector<std::string> answers;  // references for eval (plain: text, or answers list)
  std::string location() const { return source + ":" + std::to_string(line); }
};

struct BadRecord {
  std::string source;
  int64_t line = 0;
  std::string reason;   // category: "invalid json", "missing field", "image count mismatch",
                        // "missing image", "unreadable image", "zero-size image",
                        // "extreme aspect ratio", "invalid field"
  std::string detail;   // human-readable specifics
  std::string location() const { return source + ":" + std::to_string(line); }
};

// A record rejected while parsing; reason is one of BadRecord's categories.
struct BadRecordError : std::runtime_error {
  BadRecordError(std::string reason, const std::string& detail)
      : std::runtime_error(detail), reason(std::move(reason)) {}
  std::string reason;
};

struct DatasetOptions {
  DatasetFormat format = DatasetFormat::kAuto;
  std::string image_root;        // relative image paths resolve here; empty: JSONL's folder
  std::string ocr_prompt = "<image>Read the text in the image.";  // plain format's user turn
  double max_bad_fraction = 0.01;   // bad / non-empty lines above this -> vlm::Error
  int64_t max_printed_warnings = 10;
  bool probe_images = true;      // read image headers: sizes + missing/unreadable checks
  bool verify_decode = false;    // also decode every image once (slow, catches corrupt data)
  bool use_index_cache = true;   // read/write <jsonl>.index.json beside each file
  // Warning sink (one line per call); empty -> std::cerr.
  std::function<void(const std::string&)> warn;
};

struct Dataset {
  std::vector<Record> records;
  std::vector<BadRecord> bad;
  int64_t lines = 0;               // non-empty lines read, over all files
  std::map<std::string, int64_t> bad_by_reason() const;
  std::string summary() const;     // "N records from L lines; skipped K (reason: n, ...)"
};

// Loads every file (in order). Throws vlm::Error for an unreadable file, a dataset with
// no usable record, or too many bad records.
Dataset load_dataset(const std::vector<std::string>& jsonl_files, const DatasetOptions& opts);

// Format of one parsed line (kAuto when unrecognisable).
DatasetFormat detect_format(const nlohmann::json& j);

// Parses one record (no image probing); image paths resolved against image_base.
// Throws BadRecordError.
Record parse_record(const nlohmann::json& j, DatasetFormat format, const std::string& image_base,
                    const DatasetOptions& opts);

// The index file cached beside a JSONL: <jsonl>.index.json (image probes, and the text
// token counts of data/token_counts.h).
inline std::string dataset_index_path(const std::string& jsonl) { return jsonl + ".index.json"; }

// Number of kImageMarker occurrences in all turns.
int64_t count_image_markers(const Record& r);

// Rough token cost for length grouping before the tokenizer exists: merged image tokens
// under `limits` (needs probed sizes) + UTF-8 bytes of all turns / 4.
int64_t approx_token_cost(const Record& r, const vlm::PixelLimits& limits);

}  // namespace vlm::data
