// Checkpoint bench: step time around a save, checkpoint.async = false vs true, world 1.
// Not run in CI; results in bench/RESULTS.md (section 14).
//
//   OMP_NUM_THREADS=2 ./bench/checkpoint_bench --preset small --rounds 3 --out build/bench-out/ckpt
//
// The model and its policies (the tiny recipe's: vision tower and LLM layers fsdp
// full_shard, the rest ddp; fp32) train on a fixed synthetic batch (--samples rows of --text
// text tokens and one image of --image-tokens tokens each, as bench/step_bench). Each round
// runs --steps steps twice, sync then async (interleaved, so the machine's load hits both),
// and saves a checkpoint after step --save-at through app/train/checkpointer.h, the
// trainer's own path (poll at every step end, finish at the end). Per mode it reports:
//   step      median time of the steps before the save (step only)
//   save step time of the save step's iteration: the step + save() (sync: the whole write;
//             async: the begin phase and the snapshot)
//   after     median of the iterations after the save up to the one whose end committed it
//             (async: the write competes with training for the cores; sync: the next one)
//   blocked   seconds save() kept the step loop waiting
//   save wall from the start of save() to COMPLETE
//   to finish iterations save-at .. steps and the final wait for the write: wall time
// Medians over rounds; --json prints one JSON line.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/train/checkpointer.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"
#include "vlm/model/config.h"
#include "vlm/model/meta_init.h"
#include "vlm/model/vision_language_model.h"
#include "vlm/runtime/check.h"
#include "bench/synthetic_batch.h"

namespace fs = std::filesystem;

namespace {

struct Options {
  std::string preset = "small";
  int steps = 8, save_at = 3, rounds = 3, samples = 2, text = 64, image_tokens = 32;
  std::string out = "build/bench-out/checkpoint_bench";
  bool json = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      VLM_CHECK(i + 1 < argc, a, ": expected a value");
      return argv[++i];
    };
    if (a == "--preset") o.preset = val();
    else if (a == "--steps") o.steps = std::stoi(val());
    else if (a == "--save-at") o.save_at = std::stoi(val());
    else if (a == "--rounds") o.rounds = std::stoi(val());
    else if (a == "--samples") o.samples = std::stoi(val());
    else if (a == "--text") o.text = std::stoi(val());
    else if (a == "--image-tokens") o.image_tokens = std::stoi(val());
    else if (a == "--out") o.out = val();
    else if (a == "--json") o.json = true;
    else
      throw vlm::Error(vlm::str("unknown argument ", a,
                                " (expected --preset --steps --save-at --rounds --samples --text --image-tokens "
                                "--out --json)"));
  }
  VLM_CHECK(o.save_at >= 2 && o.save_at < o.steps && o.rounds >= 1, "expected 2 <= --save-at < --steps, --rounds >= 1");
  return o;
}

vlm::Batch bench_batch(const vlm::VlmConfig& c, const Options& o) {
  return vlm::bench::synthetic_batch(c, o.samples, o.text, o.image_tokens, 1234);
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Round {
  double step = 0, save_step = 0, after = 0, blocked = 0, save_wall = 0, to_finish = 0;
  double after_steps = 0;  // iterations `after` covers
  double mib = 0;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    spdlog::set_level(spdlog::level::warn);
    auto dims = vlm::sharding::ParallelDims::init(vlm::sharding::DistEnv{}, vlm::sharding::ParallelOptions{});
    vlm::VisionLanguageModel model(vlm::preset(o.preset), torch::TensorOptions().device(torch::kMeta));
    vlm::materialize(*model, {torch::kCPU, torch::kFloat32, 5});
    model->train();
    vlm::sharding::ShardingOptions so;
    so.default_policy = "ddp";
    so.rules = {{"visual.patch_embed|visual.blocks.*", "fsdp", "full_shard"}, {"visual.merger", "ddp", ""},
                {"model.layers.*", "fsdp", "full_shard"}};
    so.optim.lr = 1e-4;
    auto sm = vlm::sharding::apply_policies(*model, so, dims);
    const vlm::Batch batch = bench_batch(model->cfg, o);
    auto step = [&] {
      sm->set_sync(true);
      auto out = model->forward(batch);
      out.loss_sum.backward();
      sm->finish_backward("bench step");
      sm->optimizer().clip_grad_norm();
      sm->optimizer().step();
      sm->optimizer().zero_grad();
    };
    step();  // warm-up: allocations, thread pools
    fs::remove_all(o.out);

    std::map<std::string, std::vector<Round>> rounds;
    for (int r = 0; r < o.rounds; ++r) {
      for (const bool async : {false, true}) {
        const std::string dir = o.out + "/" + (async ? "async" : "sync") + std::to_string(r);
        vlm::app::Checkpointer ck({dir, {"# bench\n", "bench", "{}", ""}, 0, async, torch::kCPU, false}, *sm,
                                  dims.control());
        Round rd;
        std::vector<double> t(static_cast<size_t>(o.steps) + 1, 0.0);  // t[s]: iteration s, step + checkpoint calls
        int commit_step = 0;  // the step at whose end the checkpoint became complete (0: at finish)
        for (int s = 1; s <= o.steps; ++s) {
          const auto t0 = std::chrono::steady_clock::now();
          step();
          if (auto c = ck.poll(s)) {  // the trainer's step end: a no-op unless a write is pending
            commit_step = s;
            rd.save_wall = c->seconds;
          }
          if (s == o.save_at) {
            vlm::app::TrainerState st;
            st.step = s;
            if (auto c = ck.save(st, "bench")) {
              commit_step = s;
              rd.save_wall = c->seconds;
            }
            rd.blocked = ck.last_blocking_seconds();
          }
          t[static_cast<size_t>(s)] = since(t0);
        }
        const auto t_end = std::chrono::steady_clock::now();
        if (auto c = ck.finish("bench end")) rd.save_wall = c->seconds;
        rd.step = median(std::vector<double>(t.begin() + 2, t.begin() + o.save_at));  // step 1: cold caches
        rd.save_step = t[static_cast<size_t>(o.save_at)];
        const int last = commit_step > o.save_at ? commit_step : (commit_step == 0 ? o.steps : o.save_at + 1);
        rd.after = median(std::vector<double>(t.begin() + o.save_at + 1, t.begin() + last + 1));
        rd.after_steps = last - o.save_at;
        for (int s = o.save_at; s <= o.steps; ++s) rd.to_finish += t[static_cast<size_t>(s)];
        rd.to_finish += since(t_end);
        for (const auto& e : fs::directory_iterator(dir))
          if (e.is_directory())
            for (const auto& f : fs::directory_iterator(e.path()))
              if (f.path().extension() == ".safetensors") rd.mib = static_cast<double>(fs::file_size(f.path())) / (1 << 20);
        rounds[async ? "async" : "sync"].push_back(rd);
        fs::remove_all(dir);
      }
    }

    nlohmann::json j = {{"preset", o.preset}, {"steps", o.steps}, {"save_at", o.save_at}, {"rounds", o.rounds},
                        {"threads", at::get_num_threads()}};
    for (const auto& [mode, rs] : rounds) {
      auto med = [&](double Round::*f) {
        std::vector<double> v;
        for (const auto& r : rs) v.push_back(r.*f);
        return median(v);
      };
      j[mode] = {{"step_s", med(&Round::step)},   {"save_step_s", med(&Round::save_step)},
                 {"after_s", med(&Round::after)}, {"blocked_s", med(&Round::blocked)},
                 {"save_wall_s", med(&Round::save_wall)}, {"to_finish_s", med(&Round::to_finish)},
                 {"after_steps", med(&Round::after_steps)},
                 {"state_file_mib", rs.front().mib}};
    }
    if (o.json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("preset %s, %d threads, save after step %d of %d, %d round(s), state file %.1f MiB\n",
                  o.preset.c_str(), at::get_num_threads(), o.save_at, o.steps, o.rounds,
                  j["sync"]["state_file_mib"].get<double>());
      std::printf("%-6s %9s %11s %9s %10s %11s %11s\n", "mode", "step s", "save step s", "after s", "blocked s",
                  "save wall s", "to finish s");
      for (const char* mode : {"sync", "async"}) {
        const auto& m = j[mode];
        std::printf("%-6s %9.3f %11.3f %9.3f %10.3f %11.3f %11.3f\n", mode, m["step_s"].get<double>(),
                    m["save_step_s"].get<double>(), m["after_s"].get<double>(), m["blocked_s"].get<double>(),
                    m["save_wall_s"].get<double>(), m["to_finish_s"].get<double>());
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_bench: error: %s\n", e.what());
    return 1;
  }
}
