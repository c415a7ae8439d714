// Streaming reader of dataset records from one file: JSONL (one JSON value per line) or a
// JSON array (`[{...}, {...}]`, as LLaMA-Factory and ms-swift write `.json` datasets).
//
// The container is decided by the first non-blank byte (after an optional UTF-8 BOM): '['
// is a JSON array, anything else JSONL, whatever the file is named (LLaMA-Factory and
// HF `datasets` read `.json` files holding JSONL too). A JSON array is never held in
// memory as a whole: a small scanner (strings, escapes, nesting depth) finds where each
// element ends and hands over that element's text; the caller parses it on its own, so a
// malformed element is one bad record, not a failed file. What the scanner cannot
// delimit (an unterminated string, a missing ']', text after the array) ends the file
// with one error record.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace vlm::data {

struct RawRecord {
  std::string text;     // the record's JSON text
  int64_t number = 0;   // JSONL: 1-based line number; JSON array: 1-based element number
  int64_t line = 0;     // 1-based line on which the record starts
  int64_t offset = 0;   // byte offset of `text` in the file
  std::string error;    // non-empty: the container is malformed here (reason "invalid json")
};

class RecordReader {
 public:
  // Opens `path`; throws vlm::Error when it cannot be read.
  explicit RecordReader(const std::string& path);
  bool is_array() const { return array_; }
  const char* container() const { return array_ ? "json array" : "jsonl"; }
  // The next non-blank record; false at the end of the file.
  bool next(RawRecord& out);

 private:
  int peek();          // next byte (0..255) or -1 at the end, not consumed
  int get();           // next byte, consumed (tracks offset and line)
  void skip_space();
  bool next_line(RawRecord& out);
  bool next_element(RawRecord& out);

  std::string path_;
  std::ifstream in_;
  std::vector<char> buf_;
  size_t pos_ = 0, len_ = 0;
  bool eof_ = false;
  bool array_ = false;
  bool finished_ = false;  // array closed (or a fatal error reported)
  int64_t offset_ = 0;     // bytes consumed
  int64_t line_ = 1;       // current line
  int64_t number_ = 0;     // records (array) or lines (JSONL) so far
};

}  // namespace vlm::data
