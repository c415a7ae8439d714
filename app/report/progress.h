// Progress of a long task on stderr (rank 0's training, eval, synth-ocr rendering, image
// index building): on a terminal, one bar redrawn in place with count, rate and ETA; when
// stderr is not a terminal (a log file, CI), one plain line per tenth of the task (and at
// least every 30 s; nothing for a task that ends within its first second), so logs stay
// readable.
//
//   ProgressBar bar({"synth-ocr train", "images", 4000});
//   for (...) bar.update(done);
//   bar.finish();                 // the last state, then a newline (terminal)
//
//   "synth-ocr train [##########..........] 2000/4000 images  812.3/s  eta 2s"
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

namespace vlm::app {

// "45s", "3m07s", "2h05m".
std::string human_seconds(double seconds);

struct ProgressOptions {
  std::string label;          // "eval", "synth-ocr train", "image index"
  std::string unit;           // "images", "batches", "MB"
  int64_t total = 0;          // units of the whole task (> 0)
  bool enabled = true;        // false: update/finish do nothing
  bool plain_lines = true;    // not a terminal: print a line per tenth (false: nothing)
  std::optional<bool> tty;    // default: isatty(stderr)
  std::FILE* out = stderr;
  double quiet_s = 1.0;       // plain lines: none in the first quiet_s seconds (short tasks stay silent)
};

// One line of progress (no control characters): label, bar (terminal only), count, rate
// ((done - initial) / seconds) and ETA ((total - done) / rate) once the rate is known, extra.
std::string progress_line(const std::string& label, int64_t done, int64_t total, const std::string& unit,
                          double seconds, bool with_bar, const std::string& extra = "", int64_t initial = 0);

class ProgressBar {
 public:
  explicit ProgressBar(ProgressOptions o);
  ~ProgressBar();
  // `done` units of `total` are done; `extra` is appended ("loss 1.23"). A terminal redraw
  // happens at most every 0.1 s (always for the last unit).
  void update(int64_t done, const std::string& extra = "");
  // Restarts the clock with `initial` units already done (a resumed run): the rate and ETA
  // count only what this process does.
  void restart(int64_t initial);
  // Seconds left at `done` units, from this process's rate so far (0 before any unit).
  double eta_seconds(int64_t done) const;
  // Erases the bar on a terminal (before another line is logged); the next update redraws it.
  void clear();
  // Prints the final state (terminal: ends the line). Called by the destructor otherwise.
  void finish();

 private:
  ProgressOptions o_;
  bool tty_ = false;
  bool drawn_ = false, finished_ = false;
  int64_t done_ = 0, initial_ = 0;
  std::string extra_;
  int64_t next_tenth_ = 1;  // plain lines: the next tenth of the task to report
  std::chrono::steady_clock::time_point start_, last_draw_, last_line_;
  void draw();
};

// A progress callback for a task in named parts (synth-ocr's splits, one dataset file after
// another): one bar per part, finished when done == total.
using PartProgress = std::function<void(const std::string& part, int64_t done, int64_t total)>;
PartProgress part_progress(const std::string& label, const std::string& unit, bool enabled = true);
// Image index building of a dataset (data/dataset.h on_index_progress, bytes): one bar per
// file in KiB.
PartProgress index_progress(bool enabled = true);

}  // namespace vlm::app
