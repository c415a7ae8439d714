// Run report (see run_report.h).
#include "app/report/run_report.h"

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "vlm/runtime/check.h"

namespace fs = std::filesystem;

namespace vlm::app {
namespace {

std::string fmt_num(double v) {
  char buf[32];
  if (v != 0 && (std::abs(v) < 1e-2 || std::abs(v) >= 1e5))
    std::snprintf(buf, sizeof(buf), "%.2e", v);
  else
    std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

void draw_panel(cv::Mat& img, const cv::Rect& box, const Series& s) {
  const cv::Scalar axis(80, 80, 80), line(180, 90, 20), text(30, 30, 30);
  cv::rectangle(img, box, cv::Scalar(235, 235, 235), cv::FILLED);
  cv::putText(img, s.name, {box.x + 8, box.y + 20}, cv::FONT_HERSHEY_SIMPLEX, 0.55, text, 1, cv::LINE_AA);
  std::vector<std::pair<double, double>> pts;
  for (const auto& p : s.points)
    if (std::isfinite(p.second)) pts.push_back(p);
  if (pts.empty()) return;
  double x0 = pts.front().first, x1 = pts.front().first, y0 = pts.front().second, y1 = pts.front().second;
  for (const auto& [x, y] : pts) {
    x0 = std::min(x0, x); x1 = std::max(x1, x);
    y0 = std::min(y0, y); y1 = std::max(y1, y);
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) { y1 = y0 + 1e-12 + std::abs(y0) * 0.05; y0 -= std::abs(y0) * 0.05; }
  const int l = box.x + 70, r = box.x + box.width - 12, t = box.y + 30, b = box.y + box.height - 28;
  cv::line(img, {l, b}, {r, b}, axis, 1);
  cv::line(img, {l, t}, {l, b}, axis, 1);
  auto px = [&](double x) { return l + static_cast<int>((x - x0) / (x1 - x0) * (r - l)); };
  auto py = [&](double y) { return b - static_cast<int>((y - y0) / (y1 - y0) * (b - t)); };
  std::vector<cv::Point> poly;
  for (const auto& [x, y] : pts) poly.emplace_back(px(x), py(y));
  if (poly.size() == 1) cv::circle(img, poly[0], 3, line, cv::FILLED);
  else cv::polylines(img, poly, false, line, 2, cv::LINE_AA);
  const double fs = 0.4;
  cv::putText(img, fmt_num(y1), {box.x + 4, t + 5}, cv::FONT_HERSHEY_SIMPLEX, fs, text, 1, cv::LINE_AA);
  cv::putText(img, fmt_num(y0), {box.x + 4, b}, cv::FONT_HERSHEY_SIMPLEX, fs, text, 1, cv::LINE_AA);
  cv::putText(img, "step " + fmt_num(x0), {l, b + 18}, cv::FONT_HERSHEY_SIMPLEX, fs, text, 1, cv::LINE_AA);
  cv::putText(img, fmt_num(x1), {r - 40, b + 18}, cv::FONT_HERSHEY_SIMPLEX, fs, text, 1, cv::LINE_AA);
  cv::putText(img, "last " + fmt_num(pts.back().second), {r - 150, box.y + 20}, cv::FONT_HERSHEY_SIMPLEX, 0.45,
              text, 1, cv::LINE_AA);
}

}  // namespace

std::map<std::string, Series> read_metrics(const std::string& path) {
  std::ifstream in(path);
  VLM_CHECK(in.good(), "report: cannot read ", path, " (hint: pass a run directory that a training run wrote)");
  std::map<std::string, std::map<double, double>> by_field;  // field -> step -> value
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw vlm::Error(vlm::str(path, ":", n, ": not valid JSON (", e.what(), ")"));
    }
    VLM_CHECK(j.is_object() && j.contains("step") && j["step"].is_number(), path, ":", n,
              ": expected an object with a numeric \"step\"");
    const double step = j["step"].get<double>();
    for (const auto& [k, v] : j.items())
      if (k != "step" && v.is_number()) by_field[k][step] = v.get<double>();
  }
  std::map<std::string, Series> out;
  for (auto& [k, m] : by_field) {
    Series s{k, {}};
    for (auto& [x, y] : m) s.points.emplace_back(x, y);
    out[k] = std::move(s);
  }
  return out;
}

void plot_series(const std::vector<Series>& panels, const std::string& png_path, int width) {
  VLM_CHECK(!panels.empty(), "report: nothing to plot");
  const int cols = 2, ph = 260, pw = width / cols;
  const int rows = static_cast<int>((panels.size() + cols - 1) / cols);
  cv::Mat img(rows * ph, width, CV_8UC3, cv::Scalar(255, 255, 255));
  for (size_t k = 0; k < panels.size(); ++k) {
    const int r = static_cast<int>(k) / cols, c = static_cast<int>(k) % cols;
    draw_panel(img, cv::Rect(c * pw + 6, r * ph + 6, pw - 12, ph - 12), panels[k]);
  }
  VLM_CHECK(cv::imwrite(png_path, img), "report: cannot write ", png_path);
}

ReportResult write_report(const std::string& run_dir) {
  const std::string metrics = (fs::path(run_dir) / "metrics.jsonl").string();
  std::map<std::string, Series> all = read_metrics(metrics);
  std::vector<Series> panels;
  std::vector<std::string> order = {"loss", "lr", "grad_norm", "tokens_per_s", "images_per_s", "mfu", "data_wait_pct"};
  for (const auto& [k, s] : all)  // eval scores over all sets ("eval/overall/cer", ...)
    if (k.rfind("eval/overall/", 0) == 0 && k != "eval/overall/n") order.push_back(k);
  for (const auto& k : order)
    if (all.count(k)) panels.push_back(all[k]);
  ReportResult res;
  res.png = (fs::path(run_dir) / "report.png").string();
  res.html = (fs::path(run_dir) / "report.html").string();
  plot_series(panels, res.png);
  if (all.count("loss") && !all["loss"].points.empty()) res.steps = static_cast<int64_t>(all["loss"].points.back().first);

  std::ostringstream h;
  h << "<!doctype html><html><head><meta charset=\"utf-8\"><title>vlmtrain report: " << html_escape(run_dir)
    << "</title><style>body{font-family:sans-serif;margin:24px}td{padding:2px 12px}</style></head><body>\n";
  h << "<h1>" << html_escape(run_dir) << "</h1>\n<table>\n";
  auto row = [&](const std::string& k, const std::string& v) {
    h << "<tr><td>" << html_escape(k) << "</td><td>" << html_escape(v) << "</td></tr>\n";
  };
  row("steps logged", std::to_string(res.steps));
  for (const char* k : {"loss", "grad_norm", "lr", "tokens_per_s", "images_per_s", "mfu", "elapsed_s", "world_size"})
    if (all.count(k) && !all[k].points.empty()) row(std::string("last ") + k, fmt_num(all[k].points.back().second));
  if (all.count("loss") && !all["loss"].points.empty()) row("first loss", fmt_num(all["loss"].points.front().second));
  h << "</table>\n<p><img src=\"report.png\" alt=\"curves\"></p>\n";
  for (const char* extra : {"eval/eval_summary.json", "eval_summary.json", "recipe.toml"}) {
    const fs::path p = fs::path(run_dir) / extra;
    if (!fs::exists(p)) continue;
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    h << "<h2>" << extra << "</h2><pre>" << html_escape(ss.str()) << "</pre>\n";
  }
  h << "</body></html>\n";
  std::ofstream out(res.html);
  out << h.str();
  VLM_CHECK(out.good(), "report: cannot write ", res.html);
  return res;
}

}  // namespace vlm::app
