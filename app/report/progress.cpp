// Progress bars and lines (see progress.h).
#include "app/report/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "vlm/runtime/check.h"

namespace vlm::app {

std::string human_seconds(double seconds) {
  const int64_t t = static_cast<int64_t>(std::max(0.0, std::round(seconds)));
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600), static_cast<long long>((t / 60) % 60));
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  else std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(t));
  return buf;
}

std::string progress_line(const std::string& label, int64_t done, int64_t total, const std::string& unit,
                          double seconds, bool with_bar, const std::string& extra, int64_t initial) {
  std::string s = label;
  if (with_bar) {
    constexpr int kWidth = 20;
    const int filled = total > 0 ? static_cast<int>(kWidth * std::min(done, total) / total) : 0;
    s += " [" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(kWidth - filled), '.') + "]";
  }
  s += vlm::str(" ", done, "/", total, " ", unit);
  if (seconds > 0 && done > initial) {
    const double rate = static_cast<double>(done - initial) / seconds;
    char buf[64];
    std::snprintf(buf, sizeof buf, "  %.1f/s", rate);
    s += buf;
    if (done < total) s += "  eta " + human_seconds(static_cast<double>(total - done) / rate);
  }
  if (!extra.empty()) s += "  " + extra;
  return s;
}

ProgressBar::ProgressBar(ProgressOptions o) : o_(std::move(o)) {
  tty_ = o_.tty.value_or(::isatty(::fileno(o_.out)) == 1);
  start_ = last_draw_ = last_line_ = std::chrono::steady_clock::now();
  if (o_.total <= 0) o_.enabled = false;
}

ProgressBar::~ProgressBar() {
  try {
    finish();
  } catch (...) {
  }
}

void ProgressBar::draw() {
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - start_).count();
  std::fprintf(o_.out, "\r\033[K%s", progress_line(o_.label, done_, o_.total, o_.unit, secs, true, extra_, initial_).c_str());
  std::fflush(o_.out);
  drawn_ = true;
  last_draw_ = now;
}

void ProgressBar::update(int64_t done, const std::string& extra) {
  if (!o_.enabled || finished_) return;
  done_ = std::min(done, o_.total);
  extra_ = extra;
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (done_ == o_.total || !drawn_ || now - last_draw_ >= std::chrono::milliseconds(100)) draw();
    return;
  }
  if (!o_.plain_lines || std::chrono::duration<double>(now - start_).count() < o_.quiet_s) return;
  const bool tenth = done_ * 10 >= next_tenth_ * o_.total;
  if (!tenth && now - last_line_ < std::chrono::seconds(30)) return;
  while (next_tenth_ <= 10 && done_ * 10 >= next_tenth_ * o_.total) ++next_tenth_;
  const double secs = std::chrono::duration<double>(now - start_).count();
  std::fprintf(o_.out, "%s\n", progress_line(o_.label, done_, o_.total, o_.unit, secs, false, extra_, initial_).c_str());
  std::fflush(o_.out);
  last_line_ = now;
}

void ProgressBar::restart(int64_t initial) {
  initial_ = done_ = initial;
  start_ = last_line_ = std::chrono::steady_clock::now();
  while (next_tenth_ <= 10 && initial * 10 >= next_tenth_ * o_.total) ++next_tenth_;
}

double ProgressBar::eta_seconds(int64_t done) const {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (done <= initial_ || secs <= 0) return 0;
  return static_cast<double>(o_.total - done) * secs / static_cast<double>(done - initial_);
}

void ProgressBar::clear() {
  if (!tty_ || !drawn_) return;
  std::fprintf(o_.out, "\r\033[K");
  std::fflush(o_.out);
  drawn_ = false;
}

void ProgressBar::finish() {
  if (!o_.enabled || finished_) return;
  if (tty_) {
    draw();
    std::fprintf(o_.out, "\n");
    std::fflush(o_.out);
  }
  finished_ = true;
}

PartProgress part_progress(const std::string& label, const std::string& unit, bool enabled) {
  auto bars = std::make_shared<std::map<std::string, std::unique_ptr<ProgressBar>>>();
  return [=](const std::string& part, int64_t done, int64_t total) {
    auto& bar = (*bars)[part];
    if (!bar) bar = std::make_unique<ProgressBar>(ProgressOptions{label + " " + part, unit, total, enabled});
    bar->update(done);
    if (done >= total) {
      bar->finish();
      bars->erase(part);
    }
  };
}

PartProgress index_progress(bool enabled) {
  PartProgress bars = part_progress("image index", "KiB", enabled);
  return [bars](const std::string& file, int64_t done, int64_t total) { bars(file, done / 1024, total / 1024); };
}

}  // namespace vlm::app
