// Loader throughput (issue #30 item 4): samples/s and images/s the training data path
// sustains with a given number of loader worker threads, nothing else running in the
// process (no model, no step). It is the trainer's own path (app/train/train_data.h): dataset
// index, sampler, step plan, worker threads decoding + resizing + patchifying images and
// rendering + tokenizing the chat, and the consumer thread collating micro-batches.
//
//   ./bench/loader_bench RECIPE [--set key=value ...] [--samples N] [--json]
//
// The recipe's [data] / [batch] / [model] (preset + tokenizer) sections are used; set
// data.num_workers to the thread count to measure. Timed from the first step's request to
// the step that reaches --samples samples (whole steps; the dataset index is built before
// the clock starts and epochs wrap). Reported: samples/s, images/s, image tokens and text
// tokens per sample, and CPU seconds per sample: the process's, the consumer thread's
// (collate; CLOCK_THREAD_CPUTIME_ID) and the rest, the worker threads'. On a shared machine
// wall-clock rates depend on the load; samples per worker CPU second is what one worker
// thread sustains on a core of its own (OMP_NUM_THREADS=1: no intra-op pool adds CPU).
#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/config/model_source.h"
#include "app/config/recipe.h"
#include "app/train/train_data.h"
#include "vlm/model/config.h"
#include "vlm/runtime/host_malloc.h"
#include "vlm/text/tokenizer.h"

namespace {

double thread_cpu_seconds() {  // the calling thread's CPU time
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double cpu_seconds() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + 1e-6 * double(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
}

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s RECIPE [--set key=value ...] [--samples N] [--json]\n", argv0);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  vlm::tune_host_malloc();  // as vlmtrain does at start
  std::string recipe_path;
  std::vector<std::string> sets;
  int64_t target = 200;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--set" && i + 1 < argc) sets.push_back(argv[++i]);
    else if (a == "--samples" && i + 1 < argc) target = std::stoll(argv[++i]);
    else if (a == "--json") json = true;
    else if (!a.empty() && a[0] != '-' && recipe_path.empty()) recipe_path = a;
    else usage(argv[0]);
  }
  if (recipe_path.empty()) usage(argv[0]);
  try {
    const vlm::app::Recipe recipe = vlm::app::load_recipe(recipe_path, sets);
    VLM_CHECK(!recipe.model.preset.empty(), "loader_bench: needs model.preset (the model is not built)");
    vlm::VlmConfig cfg = vlm::preset(recipe.model.preset);
    std::unique_ptr<vlm::Tokenizer> tok = vlm::load_tokenizer(vlm::app::tokenizer_path(recipe.model));
    vlm::app::use_tokenizer_special_ids(cfg, *tok);
    int64_t warnings = 0;
    vlm::app::TrainData data(recipe, *tok, cfg, 0, 1, [] {}, [&](const std::string& m) {
      if (warnings++ < 5) std::fprintf(stderr, "warning: %s\n", m.c_str());
    });

    vlm::data::SamplerCursor cursor;
    int64_t samples = 0, images = 0, steps = 0, tokens = 0, image_tokens = 0, dropped = 0;
    double wait = 0;
    const double c0 = cpu_seconds(), m0 = thread_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    while (samples < target) {
      vlm::app::StepData s = data.next(cursor);
      cursor = s.next;
      ++steps;
      samples += s.samples;
      images += s.images;
      dropped += s.dropped;
      wait += s.wait_seconds;
      for (const auto& mb : s.micro_batches) {
        if (mb.filler) continue;
        const auto& b = mb.batch;
        tokens += b.attention_mask.defined() ? b.attention_mask.sum().item<int64_t>() : b.input_ids.numel();
        if (b.image_grid_thw.defined() && b.image_grid_thw.numel() > 0)
          image_tokens += b.image_grid_thw.prod(1).sum().item<int64_t>() / 4;  // merged 2x2
      }
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpu_seconds() - c0;
    const double consumer_cpu = thread_cpu_seconds() - m0;  // this thread: waiting + collate
    const double worker_cpu = cpu - consumer_cpu;           // the loader's worker threads
    const double n = double(std::max<int64_t>(1, samples));
    nlohmann::json j = {{"recipe", recipe_path},
                        {"workers", recipe.data.num_workers},
                        {"dataset", data.dataset().summary()},
                        {"steps", steps},
                        {"samples", samples},
                        {"images", images},
                        {"dropped", dropped},
                        {"wall_s", wall},
                        {"samples_per_s", double(samples) / wall},
                        {"images_per_s", double(images) / wall},
                        {"tokens_per_sample", double(tokens) / double(std::max<int64_t>(1, samples))},
                        {"image_tokens_per_image", double(image_tokens) / double(std::max<int64_t>(1, images))},
                        {"cpu_s_per_sample", cpu / n},
                        {"worker_cpu_s_per_sample", worker_cpu / n},
                        {"consumer_cpu_s_per_sample", consumer_cpu / n},
                        // what one worker thread sustains on a core of its own
                        {"samples_per_worker_cpu_s", worker_cpu > 0 ? n / worker_cpu : 0.0},
                        {"images_per_worker_cpu_s", worker_cpu > 0 ? double(images) / worker_cpu : 0.0},
                        {"cores_busy", cpu / wall},
                        {"consumer_wait_pct", 100.0 * wait / wall}};
    if (json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%lld workers: %.1f samples/s, %.1f images/s (%.0f tokens/sample, %.0f image tokens/image), "
                  "%.1f ms CPU/sample (workers %.1f), consumer waited %.0f%%\n",
                  static_cast<long long>(recipe.data.num_workers), double(samples) / wall, double(images) / wall,
                  j["tokens_per_sample"].get<double>(), j["image_tokens_per_image"].get<double>(),
                  1e3 * j["cpu_s_per_sample"].get<double>(), 1e3 * j["worker_cpu_s_per_sample"].get<double>(),
                  j["consumer_wait_pct"].get<double>());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loader_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
