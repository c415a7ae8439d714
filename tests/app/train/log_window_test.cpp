// LogWindow (app/train/log_window.h): the metrics.jsonl keys and values, the
// step log line's format, rates over the window's steps, and when a window ends.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "app/train/log_window.h"

namespace {

using vlm::app::LogWindow;
using vlm::app::StepFacts;
using vlm::app::StepStats;

// A step of `tokens` LLM tokens, 2 images, 4 samples, 1e9 FLOPs; 10 of 100 tokens padding.
StepStats log_window_step(int64_t tokens) {
  StepStats s;
  s.samples = 4;
  s.images = 2;
  s.llm_tokens = tokens;
  s.flops = 1e9;
  s.padding_tokens = 100;
  s.padding = 10;
  return s;
}

StepFacts log_window_facts(int64_t step, bool skipped) {
  StepFacts f;
  f.step = step;
  f.epoch = 0.25;
  f.loss = 2.5;
  f.grad_norm = 1.125;
  f.lr = 1e-4;
  f.skipped = skipped;
  f.supervised_tokens = 321;
  f.micro_batches = 3;
  f.dropped_samples = 1;
  f.elapsed_s = 12.5;
  return f;
}

TEST(LogWindow, MetricsKeysAndValues) {
  LogWindow w({/*every=*/2, /*steps_total=*/10, /*world=*/2, /*peak=*/1e10});
  w.add(log_window_step(1000), 1.0, 0.25, 5e6);
  vlm::sharding::MemoryReport mem;
  mem.param_bytes = 1;
  mem.grad_bytes = 2;
  mem.optim_bytes = 3;
  mem.host_optim_bytes = 4;
  mem.gathered_peak_bytes = 5;
  const nlohmann::json j = w.metrics(log_window_facts(2, false), mem, 4096);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  // nlohmann::json sorts an object's keys: compare the set, and the values.
  const std::vector<std::string> want = {
      "step", "epoch", "loss", "grad_norm", "lr", "skipped", "supervised_tokens", "tokens_per_s", "images_per_s",
      "samples_per_s", "mfu", "step_s", "data_wait_pct", "micro_batches", "pipeline_bubble", "peak_rss_bytes",
      "tensor_peak_bytes",
      "tensor_peak_planned_bytes", "mem_params_bytes", "mem_grads_bytes", "mem_optim_bytes", "mem_host_optim_bytes",
      "mem_gathered_peak_bytes", "dropped_samples", "padding_fraction", "world_size", "elapsed_s"};
  std::vector<std::string> sorted_want = want;
  std::sort(sorted_want.begin(), sorted_want.end());
  EXPECT_EQ(keys, sorted_want);
  EXPECT_EQ(j.at("step").get<int64_t>(), 2);
  EXPECT_EQ(j.at("supervised_tokens").get<int64_t>(), 321);
  EXPECT_DOUBLE_EQ(j.at("tokens_per_s").get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(j.at("mfu").get<double>(), 1e9 / (1.0 * 1e10 * 2));
  EXPECT_DOUBLE_EQ(j.at("data_wait_pct").get<double>(), 25.0);
  EXPECT_DOUBLE_EQ(j.at("padding_fraction").get<double>(), 0.1);
  EXPECT_EQ(j.at("tensor_peak_bytes").get<int64_t>(), 4096);
  EXPECT_DOUBLE_EQ(j.at("tensor_peak_planned_bytes").get<double>(), 5e6);
  EXPECT_DOUBLE_EQ(j.at("mem_gathered_peak_bytes").get<double>(), 5);
  EXPECT_EQ(j.at("world_size").get<int>(), 2);
  EXPECT_EQ(j.at("dropped_samples").get<int64_t>(), 1);
  EXPECT_DOUBLE_EQ(j.at("pipeline_bubble").get<double>(), 0.0);  // no pipeline
  EXPECT_EQ(j.at("micro_batches").get<int64_t>(), 3);
}

TEST(LogWindow, LineFormatAndRatesOverTheWindow) {
  LogWindow w({/*every=*/2, /*steps_total=*/10, /*world=*/1, /*peak=*/0});
  w.add(log_window_step(1000), 1.0, 0.5, 3.0 * 1024 * 1024);
  w.add(log_window_step(3000), 3.0, 0.5, 2.0 * 1024 * 1024);  // planned: the window's max
  EXPECT_EQ(w.line(log_window_facts(2, false), 2 * 1024 * 1024, "3m07s"),
            "step     2/10 | ep 0.25 | loss 2.5000 | gnorm 1.125 | lr 1.00e-04 | tok/s 1000 | img/s 1.0 | smp/s 2.0 "
            "| pad 10.0% | mfu 0.00% | mem 2.0M (plan 3.0M) | data 25% | eta 3m07s");
  StepFacts piped = log_window_facts(2, false);  // pipeline parallelism: p 2, m 4
  piped.pipeline_bubble = 0.2;
  EXPECT_NE(w.line(piped, 2 * 1024 * 1024, "3m07s").find("| data 25% | bubble 20% | eta 3m07s"), std::string::npos);
  const std::string skipped = w.line(log_window_facts(2, true), 2 * 1024 * 1024, "1s");
  EXPECT_EQ(skipped.substr(skipped.size() - 10), " | SKIPPED");
  w.reset();
  w.add(log_window_step(500), 0.5, 0.0, 1.0);
  const nlohmann::json j = w.metrics(log_window_facts(3, false), {}, 1);
  EXPECT_DOUBLE_EQ(j.at("tokens_per_s").get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(j.at("step_s").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j.at("tensor_peak_planned_bytes").get<double>(), 1.0);
}

TEST(LogWindow, DueEveryNStepsAndAtTheEnd) {
  LogWindow w({/*every=*/4, /*steps_total=*/10, /*world=*/1, /*peak=*/0});
  std::vector<int64_t> due;
  for (int64_t s = 1; s <= 10; ++s)
    if (w.due(s)) due.push_back(s);
  EXPECT_EQ(due, (std::vector<int64_t>{4, 8, 10}));
}

}  // namespace
