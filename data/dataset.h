// Datasets: record formats, JSONL or JSON-array files, LLaMA-Factory dataset_info.json
// entries, image path resolution and embedded base64 images, image header probing (sizes
// known before decoding, cached beside the dataset), bad-record accounting.
//
// Formats (auto-detected per file from its first parseable record, or forced):
//   messages : {"messages":[{"role":"user","content":"<image>Read."},
//                           {"role":"assistant","content":"..."}], "images":["a.jpg"]}
//              content may also be a list of parts: {"type":"text","text":..},
//              {"type":"image"[,"image":src]}, {"type":"image_url","image_url":{"url":src}}
//   swift    : ms-swift's standard format: the messages shape, read by the same parser
//              (images as paths, data URIs or raw base64); never auto-detected as such
//   llava    : {"image":"a.jpg" | ["a.jpg",..], "conversations":[{"from":"human",
//               "value":"<image>\n..."},{"from":"gpt","value":"..."}]}
//   sharegpt : LLaMA-Factory's sharegpt format with its rules: column and tag names from
//              dataset_info.json (defaults conversations/from/value/human/gpt/system), an
//              optional leading system turn, then strictly user/assistant pairs
//   alpaca   : LLaMA-Factory's alpaca format: instruction (+ "\n" + input) -> output, with
//              optional system, history [[q, a], ..] and images columns
//   plain    : {"image":"a.png","text":"ground truth"[, "answers":[..]]}; the user turn is
//              the recipe's OCR prompt.
// Auto-detection: "messages" -> messages, "conversations" -> llava, "instruction" and
// "output" -> alpaca, "text"/"answers" -> plain. sharegpt and swift are named explicitly
// (data.format) or through dataset_info.json.
//
// Files: a JSONL file or a JSON array (data/record_reader.h: streamed record by record),
// or a LLaMA-Factory dataset named as "path/to/dataset_info.json#name" (data/dataset_info.h).
// Image strings: a path (relative: against data.image_root, else the dataset file's folder,
// else for dataset_info entries the dataset_info.json folder as LLaMA-Factory's media_dir),
// a "data:image/...;base64," URI or raw base64 (data/image_source.h).
//
// A record keeps its conversation turns with "<image>" markers, its images (resolved path
// + oriented size) and its reference answers; chat rendering and tokenization happen
// later (sample building), so this file knows nothing about tokenizers.
//
// Bad records (skipped, each with file:line, or file:record N in a JSON array, and a
// reason; first few printed, all counted): invalid JSON, missing/invalid fields, unknown
// or unsupported roles, invalid turn order, marker count != image count, bad base64,
// missing/unreadable image, zero-size image, aspect ratio > 200. Too many (>
// max_bad_fraction of the records read) is an error. Nothing is ever dropped silently.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "vlm/model/image_geometry.h"

namespace vlm::data {

enum class DatasetFormat { kAuto, kMessages, kLlava, kPlainOcr, kSharegpt, kAlpaca, kSwift };
// auto | messages | llava (conversations) | plain (ocr) | sharegpt | alpaca | swift
DatasetFormat parse_dataset_format(const std::string& name);
std::string to_string(DatasetFormat f);

// The marker that stands for one image inside turn contents.
inline constexpr const char* kImageMarker = "<image>";

struct Turn {
  std::string role;      // "system" | "user" | "assistant"
  std::string content;   // text with one kImageMarker per image, in image order
};

struct ImageRef {
  std::string path;      // resolved path (image_root or the JSONL's folder applied); for an
                         // embedded image a label: "<file>:<record> image <i> (base64)"
  int64_t width = 0;     // oriented width (EXIF 5-8 swapped); 0 when not probed
  int64_t height = 0;
  // Embedded (base64) image: its text lies in embedded_file at bytes [embedded_offset,
  // +embedded_length), or, when it could not be located there verbatim, in embedded_text.
  bool embedded = false;
  std::string embedded_file;
  int64_t embedded_offset = -1;
  int64_t embedded_length = 0;
  std::shared_ptr<const std::string> embedded_text;
};

// "file:LINE" (JSONL) or "file:record N" (JSON array; N 1-based).
inline std::string record_location(const std::string& file, int64_t line, bool in_array) {
  return file + (in_array ? ":record " : ":") + std::to_string(line);
}

struct Record {
  std::string source;              // dataset file
  int64_t line = 0;                // 1-based line in source (JSON array: element number)
  bool in_array = false;           // source is a JSON array
  DatasetFormat format = DatasetFormat::kAuto;
  std::vector<Turn> turns;
  std::vector<ImageRef> images;
  std::vector<std::string> answers;  // references for eval (plain: text, or answers list)
  std::string location() const { return record_location(source, line, in_array); }
};

struct BadRecord {
  std::string source;
  int64_t line = 0;
  std::string reason;   // category: "invalid json", "missing field", "invalid field",
                        // "unknown role", "unsupported role", "invalid turn order",
                        // "image count mismatch", "bad base64", "missing image",
                        // "unreadable image", "zero-size image", "extreme aspect ratio"
  std::string detail;   // human-readable specifics
  bool in_array = false;
  std::string location() const { return record_location(source, line, in_array); }
};

// A record rejected while parsing; reason is one of BadRecord's categories.
struct BadRecordError : std::runtime_error {
  BadRecordError(std::string reason, const std::string& detail)
      : std::runtime_error(detail), reason(std::move(reason)) {}
  std::string reason;
};

// LLaMA-Factory's column and tag names (dataset_info.json "columns" and "tags"). The
// defaults here are what vlmtrain uses for data.format = sharegpt | alpaca without a
// dataset_info.json; an entry starts from LLaMA-Factory's own defaults (no system, history
// or images column: llamafactory_defaults()) and applies its "columns" and "tags".
struct ColumnMap {
  std::string messages = "conversations";  // sharegpt: the turns
  std::string system = "system";           // both: system prompt column ("" = none)
  std::string images = "images";           // both: image list column ("" = none)
  std::string prompt = "instruction";      // alpaca: user instruction
  std::string query = "input";             // alpaca: appended to the instruction after "\n"
  std::string response = "output";         // alpaca: the answer
  std::string history = "history";         // alpaca: [[query, answer], ..] before ("" = none)
  std::string role_tag = "from", content_tag = "value";
  std::string user_tag = "human", assistant_tag = "gpt", system_tag = "system";
  std::string observation_tag = "observation", function_tag = "function_call";
  bool from_dataset_info = false;          // set by an entry (no messages/conversations fallback)
  static ColumnMap llamafactory_defaults();
};

// One file to read: a data.train / data.eval entry resolved (data/dataset_info.h).
struct DatasetFile {
  std::string spec;        // the entry as written ("a.jsonl", "info.json#name")
  std::string path;        // the file read
  DatasetFormat format = DatasetFormat::kAuto;  // kAuto: data.format (then detection)
  std::string image_base;  // relative image paths resolve here ("" = data.image_root or the
                           // file's folder)
  ColumnMap columns;
};

// What was read from one file (for `vlmtrain inspect data`).
struct FileSummary {
  std::string spec, path;
  std::string container;   // "jsonl" | "json array"
  DatasetFormat format = DatasetFormat::kAuto;  // forced or detected (kAuto: nothing usable)
  int64_t records = 0;     // usable
  int64_t bad = 0;
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
  // Progress while image headers are probed (building <file>.index.json): bytes of `file`
  // read so far; the last call has done == total. Not called for files whose index is
  // cached. Empty: nothing.
  std::function<void(const std::string& file, int64_t done, int64_t total)> on_index_progress;
};

struct Dataset {
  std::vector<Record> records;
  std::vector<BadRecord> bad;
  std::vector<FileSummary> files;  // one per file read, in order
  int64_t lines = 0;               // records read (non-empty lines, array elements), all files
  std::map<std::string, int64_t> bad_by_reason() const;
  std::string summary() const;     // "N records from L lines; skipped K (reason: n, ...)"
};

// Loads every file (in order); entries may name dataset_info.json datasets
// ("info.json#name", see data/dataset_info.h). Throws vlm::Error for an unreadable file or
// dataset_info entry, a dataset with no usable record, or too many bad records.
Dataset load_dataset(const std::vector<std::string>& files, const DatasetOptions& opts);

// Format of one parsed line (kAuto when unrecognisable).
DatasetFormat detect_format(const nlohmann::json& j);

// Parses one record (no image probing); image paths resolved against image_base; embedded
// base64 images keep their text (embedded_text). Throws BadRecordError.
Record parse_record(const nlohmann::json& j, DatasetFormat format, const std::string& image_base,
                    const DatasetOptions& opts, const ColumnMap& columns = ColumnMap{});

// The index file cached beside a JSONL: <jsonl>.index.json (image probes, and the text
// token counts of data/token_counts.h).
inline std::string dataset_index_path(const std::string& jsonl) { return jsonl + ".index.json"; }

// Number of kImageMarker occurrences in all turns.
int64_t count_image_markers(const Record& r);

// Rough token cost for length grouping before the tokenizer exists: merged image tokens
// under `limits` with resize factor `factor` (the model's patch x merge; needs probed
// sizes) + UTF-8 bytes of all turns / 4 (about 4 bytes per text token).
int64_t approx_token_cost(const Record& r, const vlm::PixelLimits& limits, int64_t factor = 28);

}  // namespace vlm::data
