// TensorBoard event files, written without TensorFlow or a protobuf library: TFRecord
// framing around hand-encoded `Event` protos (tensorboard/compat/proto/event.proto,
// summary.proto), enough for scalar time series.
//
//   TensorBoardWriter tb(out_dir + "/tb", /*first_step=*/st.step + 1);
//   nlohmann::json line = {{"step", 7}, {"loss", 2.5}, {"eval/val/cer", 0.1}};
//   tb.write_metrics(line);   // train/loss = 2.5, eval/val/cer = 0.1 at step 7; flushed
//
// File layout (one file per process start, as TensorBoard expects):
//   <dir>/events.out.tfevents.<unix seconds>.<host>.<pid>.vlmtrain
//   record  := uint64 len | uint32 masked_crc32c(len bytes) | data[len] | uint32 masked_crc32c(data)
//   masked  := ((crc >> 15) | (crc << 17)) + 0xa282ead8        (all integers little-endian)
//   records := Event{wall_time, step 0, file_version "brain.Event:2"}
//              Event{wall_time, step first_step, session_log {status START}}
//              Event{wall_time, step, summary {value {tag, simple_value}}...}...
// The SessionLog START tells TensorBoard that the run (re)started at first_step: events of
// earlier files with step >= first_step (a run that went on past its last checkpoint and
// was resumed from it) are dropped, so a resumed run's curves continue without doubles.
// The file names sort in start order (the seconds are bumped past any existing file's),
// which is the order TensorBoard reads them in.
//
// Failures (directory not creatable, disk full) are logged once as a warning and the
// writer goes quiet: TensorBoard output never stops a training run.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlm::app {

// ---------------------------------------------------------------- wire format

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor ~0), as in
// RFC 3720 (iSCSI) B.4 and TFRecord. crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n);
// The TFRecord mask of a CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t mask_crc32c(uint32_t crc);

// One TFRecord (header, payload, footer) around `payload`.
std::string tfrecord(std::string_view payload);

struct TbScalar {
  std::string tag;
  float value = 0;
};

// Serialised `Event` messages (proto3 wire format; field numbers from event.proto).
std::string event_file_version(double wall_time);                          // file_version = 3
std::string event_session_start(double wall_time, int64_t step);           // session_log = 7
std::string event_scalars(double wall_time, int64_t step, const std::vector<TbScalar>& values);  // summary = 5

// The scalars of one metrics.jsonl line (the object the trainer writes there): every number
// or boolean (as 0/1) except "step" and the line's "eval_full" flag; keys with a '/' (the
// evaluator's "eval/<set>/<metric>") keep their name, the others become "train/<key>".
// Nulls and non-numbers are skipped.
std::vector<TbScalar> tb_scalars_from_metrics(const nlohmann::json& line);

// ---------------------------------------------------------------- writer

class TensorBoardWriter {
 public:
  // Inactive (every call a no-op) when `dir` is empty. Otherwise creates `dir`, opens a new
  // events file there and writes the file_version and the SessionLog START at `first_step`
  // (the first step this process will log). Never throws.
  TensorBoardWriter(std::string dir, int64_t first_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Writes the line's scalars (tb_scalars_from_metrics) as one event at line["step"], then
  // flushes so a live TensorBoard sees it. A line without "step" or scalars writes nothing.
  void write_metrics(const nlohmann::json& line);
  // Writes one event and flushes.
  void write(int64_t step, const std::vector<TbScalar>& values);

  bool active() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }  // the events file ("" when inactive)

 private:
  void append(const std::string& event);  // framed and written; on error: warn once, go quiet
  void fail(const std::string& what);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace vlm::app
