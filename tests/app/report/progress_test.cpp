// Progress bars and lines (app/report/progress.h): the line's fields against their formulas, the
// terminal redraw, the plain-line cadence (one per tenth), resumed tasks, parts.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "app/report/progress.h"

using vlm::app::ProgressBar;
using vlm::app::ProgressOptions;

namespace {

// Everything written to a temporary FILE*.
struct PgCapture {
  std::FILE* f = std::tmpfile();
  ~PgCapture() { std::fclose(f); }
  std::string text() {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    std::fseek(f, 0, SEEK_END);
    return s;
  }
};

int pg_count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(Progress, LineFieldsFollowTheirFormulas) {
  // 250 of 1000 in 5 s: 50/s, 750 left -> 15 s.
  EXPECT_EQ(vlm::app::progress_line("synth-ocr train", 250, 1000, "images", 5.0, true),
            "synth-ocr train [#####...............] 250/1000 images  50.0/s  eta 15s");
  EXPECT_EQ(vlm::app::progress_line("eval", 3, 4, "batches", 2.0, false, "12 samples"),
            "eval 3/4 batches  1.5/s  eta 1s  12 samples");
  // No rate before the first unit; no ETA once done.
  EXPECT_EQ(vlm::app::progress_line("x", 0, 10, "u", 1.0, false), "x 0/10 u");
  EXPECT_EQ(vlm::app::progress_line("x", 10, 10, "u", 4.0, false), "x 10/10 u  2.5/s");
  // A resumed task: the rate counts this process's units only (100 -> 160 in 60 s: 1/s).
  EXPECT_EQ(vlm::app::progress_line("train", 160, 1000, "steps", 60.0, false, "", 100),
            "train 160/1000 steps  1.0/s  eta 14m00s");
  EXPECT_EQ(vlm::app::human_seconds(45), "45s");
  EXPECT_EQ(vlm::app::human_seconds(187), "3m07s");
  EXPECT_EQ(vlm::app::human_seconds(7500), "2h05m");
}

TEST(Progress, PlainLinesOncePerTenth) {
  PgCapture cap;
  {
    ProgressBar bar(ProgressOptions{"job", "items", 200, true, true, false, cap.f, /*quiet_s=*/0});
    for (int i = 1; i <= 200; ++i) bar.update(i);
  }
  const std::string s = cap.text();
  EXPECT_EQ(pg_count(s, "\n"), 10) << s;  // 20, 40, ..., 200
  EXPECT_EQ(pg_count(s, "\r"), 0) << s;
  EXPECT_NE(s.find("job 20/200 items"), std::string::npos) << s;
  EXPECT_NE(s.find("job 200/200 items"), std::string::npos) << s;
  EXPECT_EQ(s.find("job 21/200"), std::string::npos) << s;
}

TEST(Progress, TerminalRedrawsInPlaceAndEndsTheLine) {
  PgCapture cap;
  ProgressBar bar(ProgressOptions{"job", "items", 5, true, true, true, cap.f});
  for (int i = 1; i <= 5; ++i) bar.update(i);
  bar.finish();
  bar.update(3);  // after finish: nothing
  const std::string s = cap.text();
  EXPECT_GE(pg_count(s, "\r\033[K"), 2) << s;  // the first draw and the last unit at least
  EXPECT_EQ(pg_count(s, "\n"), 1) << s;
  EXPECT_NE(s.find("[####################] 5/5 items"), std::string::npos) << s;
  EXPECT_EQ(s.back(), '\n');
}

TEST(Progress, DisabledPlainOffOrShortTasksWriteNothing) {
  PgCapture cap;
  {
    ProgressBar off(ProgressOptions{"job", "items", 10, false, true, true, cap.f});
    ProgressBar quiet(ProgressOptions{"job", "items", 10, true, false, false, cap.f, 0});
    ProgressBar fast(ProgressOptions{"job", "items", 10, true, true, false, cap.f, /*quiet_s=*/60});
    for (int i = 1; i <= 10; ++i) {
      off.update(i);
      quiet.update(i);
      fast.update(i);
    }
  }
  EXPECT_EQ(cap.text(), "");
}

TEST(Progress, ResumedTaskCountsTenthsFromWhereItStarts) {
  PgCapture cap;
  {
    ProgressBar bar(ProgressOptions{"train", "steps", 100, true, true, false, cap.f, /*quiet_s=*/0});
    bar.restart(55);
    for (int i = 56; i <= 100; ++i) bar.update(i);
  }
  const std::string s = cap.text();
  EXPECT_EQ(s.find("train 50/100"), std::string::npos) << s;  // tenths before the restart: not reported
  EXPECT_NE(s.find("train 60/100"), std::string::npos) << s;
  EXPECT_EQ(pg_count(s, "\n"), 5) << s;  // 60, 70, 80, 90, 100
}

TEST(Progress, EtaFromThisProcesssRate) {
  PgCapture cap;
  ProgressBar bar(ProgressOptions{"train", "steps", 100, false, false, false, cap.f});
  bar.restart(40);
  EXPECT_EQ(bar.eta_seconds(40), 0);  // no unit done yet by this process
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(50)) {
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // 10 steps in ~secs: 50 left take ~5 x secs (bounds: the clocks of the two reads differ).
  const double eta = bar.eta_seconds(50);
  EXPECT_GT(eta, 5 * secs * 0.9);
  EXPECT_LT(eta, 5 * secs * 1.5 + 0.05);
}
