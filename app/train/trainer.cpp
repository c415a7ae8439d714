// The trainer. Reads top to bottom: processes -> tokenizer + model -> policies -> data ->
// resume -> the step loop (data, forward/backward per micro-batch, reduce, clip, guard,
// update, log, eval, checkpoint) -> final checkpoint.
#include "app/train/trainer.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "app/train/batch_dump.h"
#include "app/train/checkpoint.h"
#include "app/eval/evaluator.h"
#include "app/report/logging.h"
#include "app/train/lr_schedule.h"
#include "app/config/model_source.h"
#include "app/plan/flop_model.h"
#include "vlm/runtime/process_memory.h"
#include "app/report/progress.h"
#include "app/config/sharding_options.h"
#include "app/plan/step_memory.h"
#include "app/plan/memory_plan.h"
#include "app/report/tensorboard.h"
#include "app/train/train_data.h"
#include "data/synth_ocr.h"
#include "sharding/dist/comm.h"
#include "sharding/parallel/ddp.h"
#include "sharding/dist/device_context.h"
#include "sharding/dist/fingerprint.h"
#include "sharding/parallel/lora.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/sharded_model.h"
#include "vlm/runtime/check.h"
#include "vlm/runtime/host_malloc.h"

namespace fs = std::filesystem;
using vlm::sharding::ReduceOp;

namespace vlm::app {
namespace {

// ---------------------------------------------------------------- signals
std::atomic<int> g_signal{0};
extern "C" void on_stop_signal(int sig) {
  g_signal.store(sig);
  std::signal(sig, SIG_DFL);  // a second signal ends the process the usual way
}

// ---------------------------------------------------------------- synthetic data
// data.synth.generate_if_missing: rank 0 renders the set into data.train[0]'s folder
// when it is missing, or when synth_ocr.json there says it was rendered differently
// (other options, older renderer). Rank 0 decides; every rank learns it by all-reduce.
void ensure_synth_data(const Recipe& recipe, vlm::sharding::Comm& comm, bool main) {
  const auto& syn = recipe.data.synth;
  if (!syn.generate_if_missing || recipe.data.train.empty()) return;
  vlm::data::SynthOcrOptions so;
  so.out_dir = fs::path(recipe.data.train.front()).parent_path().string();
  so.train = syn.train;
  so.val = syn.val;
  so.seed = static_cast<uint64_t>(syn.seed);
  so.layout = syn.layout;
  so.style = syn.style;
  so.min_height = syn.min_height;
  so.max_height = syn.max_height;
  so.tokenizer_type = syn.tokenizer;
  so.vocab_size = syn.vocab_size;
  so.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const std::string why = main ? vlm::data::synth_ocr_refresh_reason(so) : "";
  torch::Tensor render = torch::tensor({why.empty() ? 0.0 : 1.0}, torch::kFloat64);
  comm.all_reduce(render, ReduceOp::kSum, "synthetic data check");
  if (render.item<double>() == 0) return;
  std::string error;
  if (main) {
    spdlog::info("data.synth: {}: rendering {} + {} synthetic OCR lines into {}", why, so.train, so.val,
                 so.out_dir);
    so.on_progress = part_progress("data.synth", "images");
    try {
      vlm::data::SynthOcrResult r = vlm::data::write_synth_ocr(so);
      spdlog::info("data.synth: done in {:.1f} s", r.seconds);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  torch::Tensor failed = torch::tensor({error.empty() ? 0.0 : 1.0}, torch::kFloat64);
  comm.all_reduce(failed, ReduceOp::kSum, "synthetic data");
  if (!error.empty()) throw vlm::Error("data.synth: " + error);
  VLM_CHECK(failed.item<double>() == 0, "data.synth: rank 0 failed to render the synthetic set (see its log)");
  VLM_CHECK(fs::exists(recipe.data.train.front()), "data.synth: rendered the set but ", recipe.data.train.front(),
            " is still missing (hint: data.train[0] must be <folder>/train.jsonl)");
}

// ---------------------------------------------------------------- fault injection (tests)
// VLMTRAIN_FAULT_NONFINITE="STEP[:RANK]": the loss of step STEP (1-based) becomes NaN on
// RANK (default 0) before backward, so its gradients are NaN.
bool inject_nonfinite(int64_t step, int rank) {
  const char* env = std::getenv("VLMTRAIN_FAULT_NONFINITE");
  if (env == nullptr || *env == '\0') return false;
  const std::string s = env;
  const size_t colon = s.find(':');
  const int64_t at = std::stoll(s.substr(0, colon));
  const int who = colon == std::string::npos ? 0 : std::stoi(s.substr(colon + 1));
  return at == step && who == rank;
}

// VLMTRAIN_FAULT_EXIT="STEP[:RANK]": RANK (default 0) dies abruptly (_exit(3), no
// cleanup) before step STEP, in the launcher's first attempt only
// (TORCHELASTIC_RESTART_COUNT unset or 0), to test restarts.
void maybe_fault_exit(int64_t step, int rank) {
  const char* env = std::getenv("VLMTRAIN_FAULT_EXIT");
  if (env == nullptr || *env == '\0') return;
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (restart != nullptr && std::atoi(restart) != 0) return;
  const std::string s = env;
  const size_t colon = s.find(':');
  const int64_t at = std::stoll(s.substr(0, colon));
  const int who = colon == std::string::npos ? 0 : std::stoi(s.substr(colon + 1));
  if (at == step && who == rank) {
    std::fprintf(stderr, "VLMTRAIN_FAULT_EXIT: rank %d exits before step %lld\n", rank, static_cast<long long>(step));
    std::fflush(stderr);
    ::_exit(3);
  }
}

// ---------------------------------------------------------------- metrics.jsonl + TensorBoard
// Every metrics line goes to <output_dir>/metrics.jsonl and, with log.tensorboard, the same
// object's numbers to the TensorBoard events under <output_dir>/tb/ (rank 0 only), so the
// two cannot drift. `first_step` is the first step this process logs (after a resume).
class MetricsFile {
 public:
  MetricsFile(const std::string& dir, bool enabled, bool tensorboard, int64_t first_step)
      : tb_(enabled && tensorboard ? (fs::path(dir) / "tb").string() : "", first_step) {
    if (!enabled) return;
    path_ = (fs::path(dir) / "metrics.jsonl").string();
    out_.open(path_, std::ios::app);
    VLM_CHECK(out_.good(), "cannot open ", path_, " for appending (hint: check run.output_dir)");
  }
  void write(const nlohmann::json& j) {
    if (!out_.is_open()) return;
    out_ << j.dump() << "\n";
    out_.flush();
    tb_.write_metrics(j);
  }
  const std::string& tensorboard_file() const { return tb_.path(); }

 private:
  std::string path_;
  std::ofstream out_;
  TensorBoardWriter tb_;
};

std::string short_bytes(double b) {
  const char* units[] = {"B", "K", "M", "G", "T"};
  int k = 0;
  while (b >= 1024 && k < 4) {
    b /= 1024;
    ++k;
  }
  return fmt::format("{:.1f}{}", b, units[k]);
}

// One line on how the weights arrived on this rank (sharded loading, sharded_load.h) and what
// start-up cost in memory, next to the rank's persistent share it must stay close to.
void log_sharded_load(const vlm::sharding::ShardedLoadStats& st, const vlm::sharding::MemoryReport& m,
                      int64_t rss_before_model, vlm::sharding::ParallelDims& dims, bool random_init, bool sharded) {
  if (!dims.is_main()) return;
  const vlm::sharding::DeviceMemory dev = dims.device_context().memory();
  const std::string how =
      sharded ? vlm::str(random_init ? "initialised" : "read", " on rank 0: ", st.sharded_units, " units sharded, ",
                         st.whole_units, " whole, ", st.elements_filled, " elements filled, ",
                         short_bytes(static_cast<double>(st.bytes_read)), " read")
              : std::string("whole model on every rank, rank 0's broadcast (model.sharded_load = false)");
  spdlog::info("weights: {} | persistent share {} | host RSS {} before the model, {} now, peak {}{}", how,
               short_bytes(m.persistent()),
               short_bytes(static_cast<double>(rss_before_model)), short_bytes(static_cast<double>(current_rss_bytes())),
               short_bytes(static_cast<double>(std::max(peak_rss_bytes(), current_rss_bytes()))),  // maxrss lags
               dims.device().is_cuda() ? vlm::str(" | device allocated ", short_bytes(static_cast<double>(dev.allocated)),
                                                  ", peak ", short_bytes(static_cast<double>(dev.peak_allocated)))
                                       : std::string());
}

int64_t total_steps(const Recipe& r, int64_t steps_per_epoch) {
  if (r.schedule.steps > 0) return r.schedule.steps;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(r.schedule.epochs * static_cast<double>(steps_per_epoch))));
}

}  // namespace

TrainSummary run_training(const Recipe& recipe) {
  // ---------------------------------------------------------------- processes
  const vlm::sharding::ParallelOptions po = parallel_options(recipe);
  const auto env = vlm::sharding::detect_dist_env(vlm::sharding::process_env());
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {  // one share of the cores per local rank
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    at::set_num_threads(std::max(1, hw / std::max(1, env.local_world_size)));
  }
  vlm::sharding::ParallelDims dims = vlm::sharding::ParallelDims::init(env, po);
  const int rank = dims.rank(), world = dims.world_size();
  init_logging(rank, world, recipe.log.level, recipe.log.all_ranks);
  try {
    // Every collective of this file is host-side agreement: the control plane (Gloo on CPU
    // tensors, whatever the device). Parameters and gradients use dims.comm() inside sharding/.
    vlm::sharding::Comm& comm = dims.control();
    const bool main = dims.is_main();
    const bool tty = main && isatty(STDERR_FILENO);
    const std::string out_dir = recipe.run.output_dir;
    if (main) {
      spdlog::info("vlmtrain {} | {} | recipe {} (hash {})", VLMTRAIN_VERSION, env.describe(), recipe.source,
                   recipe_hash(recipe));
      if (!vlm::host_malloc_setting().empty()) spdlog::info("{}", vlm::host_malloc_setting());
      if (dims.distributed())
        spdlog::info("comm: data plane {}, one group per lane (main, fsdp-gather, fsdp-reduce, ddp) | control plane {}",
                     dims.comm().transport(), comm.transport());
      if (dims.has_mesh())
        spdlog::info("mesh: dp_replicate {} x dp_shard {}: hybrid_shard units are sharded within groups of {} "
                     "consecutive ranks and their gradients all-reduced across {} replicas",
                     dims.dp_replicate(), dims.dp_shard(), dims.dp_shard(), dims.dp_replicate());
      spdlog::info("resolved recipe:\n{}", to_toml(recipe));
      spdlog::info("resolved recipe saved to {}", save_resolved_recipe(recipe, out_dir));
    }
    torch::manual_seed(static_cast<uint64_t>(recipe.run.seed) * 7919 + static_cast<uint64_t>(rank));

    // ---------------------------------------------------------------- synthetic data
    ensure_synth_data(recipe, comm, main);

    // ---------------------------------------------------------------- tokenizer + model
    const torch::Dtype param_dtype = recipe_dtype(recipe.precision.param_dtype);
    const int64_t rss_before_model = current_rss_bytes();
    LoadModelOptions load_opts{static_cast<uint64_t>(recipe.run.seed), dims.device(), param_dtype};
    load_opts.deferred = recipe.model.sharded_load;  // built on meta; apply_policies materialises this rank's share
    LoadedModel lm = load_model(recipe.model, load_opts, recipe.source);
    vlm::VisionLanguageModel model = lm.model;
    const std::unique_ptr<vlm::Tokenizer>& tok = lm.tokenizer;
    const vlm::VlmConfig cfg = model->cfg;
    const std::string model_source = lm.description;
    model->train();
    if (main) spdlog::info("model: {} | {}", vlm::family_name(cfg.family), model_source);

    // ---------------------------------------------------------------- policies
    auto sm = vlm::sharding::apply_policies(*model, sharding_options(recipe), dims, lm.source.get());
    lm.source.reset();  // unmaps the checkpoint
    log_sharded_load(sm->load_stats(), sm->memory(), rss_before_model, dims, lm.random_init,
                     recipe.model.sharded_load);
    const vlm::sharding::ShardingOptions so = sharding_options(recipe);
    vlm::app::MemoryPlan plan =
        vlm::app::plan_memory(sm->unit_table(), world, so.param_dtype, so.reduce_dtype,
                                   so.fsdp_accumulate_unsharded, dims.has_mesh() ? dims.dp_shard() : 0);
    if (so.optimizer_offload) vlm::app::plan_offload(plan, sm->unit_table());  // optimizer bytes -> host
    // The step log's "plan": this memory plan plus the micro-batches' activations (step_memory.h).
    const StepMemoryModel step_memory(*model, plan, sm->unit_table(), so.param_dtype,
                                      dims.device().is_cuda() ? vlm::app::AttentionPath::cuda : vlm::app::AttentionPath::cpu,
                                      recipe.data.prefetch * recipe.batch.samples_per_rank);
    if (main) {
      const vlm::sharding::MemoryReport m0 = sm->memory();
      const vlm::sharding::ParamCounts pc = vlm::sharding::count_params(sm->unit_table());
      spdlog::info("unit table:\n{}params: total {}, trainable {}\nmemory per rank: params {} + grads {} + "
                   "optimizer {} (persistent){}; plan: {} persistent + {} transient (gathered units, reduce-scatter "
                   "buffers, unsharded sums) = {} before activations; the step log's mem is the measured peak "
                   "of tensor bytes on the device, next to the plan for the micro-batches the window ran "
                   "(inputs and activations added; app/plan/step_memory.h)",
                   vlm::sharding::unit_table_text(sm->unit_table()), pc.total, pc.trainable,
                   short_bytes(m0.param_bytes), short_bytes(m0.grad_bytes), short_bytes(m0.optim_bytes),
                   m0.host_optim_bytes > 0 ? fmt::format("; optimizer state in host memory {} (sharding.optimizer_offload)",
                                                         short_bytes(m0.host_optim_bytes))
                                           : std::string(),
                   short_bytes(plan.total.total()), short_bytes(plan.peak_bytes() - plan.total.total()),
                   short_bytes(plan.peak_bytes()));
      for (const auto& n : sm->notes()) spdlog::warn("{}", n);
    }

    // ---------------------------------------------------------------- data
    auto warn = [](const std::string& m) { spdlog::warn("{}", m); };
    TrainData data(recipe, *tok, cfg, rank, world, [&] { comm.barrier("dataset index caches"); }, warn);
    const int64_t steps_total = total_steps(recipe, data.steps_per_epoch());
    if (main)
      spdlog::info("data: {} | {} steps per epoch of {} samples ({} per rank) | {} steps | packing {}",
                   data.dataset().summary(), data.steps_per_epoch(), recipe.batch.samples_per_rank * world,
                   recipe.batch.samples_per_rank, steps_total,
                   recipe.batch.packing ? "on (padding-free rows)" : "off (padded rows)");
    vlm::sharding::check_fingerprint(
        comm, vlm::sharding::Fingerprint::standard(recipe_hash(recipe), vlm::to_hf_json(cfg).dump(),
                                                   vlm::sharding::unit_table_text(sm->unit_table()),
                                                   data.dataset_size()));

    // ---------------------------------------------------------------- resume
    TrainerState st;
    CheckpointFiles files{to_toml(recipe), recipe_hash(recipe), vlm::to_hf_json(cfg).dump(2),
                          fs::absolute(tokenizer_path(recipe.model, recipe.source)).string()};
    TrainSummary summary;
    if (auto from = resolve_resume(recipe.checkpoint.resume, out_dir)) {
      CheckpointReader ck(*from);
      st = ck.state();
      sm->load_state(ck.reader(), st.optimizer_steps);
      if (ck.world_size() == world) {
        torch::Tensor rng = ck.rng_state(rank);
        if (rng.defined()) {
          at::Generator gen = at::detail::getDefaultCPUGenerator();
          gen.set_state(rng);
        }
      }
      if (main) {
        spdlog::info("resumed from {} at step {} (written by {} rank(s), now {}), data cursor epoch {} offset {}",
                     *from, st.step, ck.world_size(), world, st.cursor.epoch, st.cursor.offset);
        if (ck.recipe_hash() != recipe_hash(recipe))
          spdlog::warn("the checkpoint was written by a recipe with another hash ({} vs {}): see its recipe.toml",
                       ck.recipe_hash(), recipe_hash(recipe));
      }
    }
    summary.start_step = summary.end_step = st.step;

    // ---------------------------------------------------------------- loop set-up
    LrSchedule sched{steps_total, recipe.schedule.warmup_steps, recipe.schedule.decay, recipe.schedule.min_lr_ratio};
    FlopModel flop_model(sm->unit_table(), cfg);
    std::string peak_how;
    const double peak = peak_flops_per_rank(dims.device(), &peak_how);
    MetricsFile metrics(out_dir, main, recipe.log.tensorboard, st.step + 1);
    if (main && !metrics.tensorboard_file().empty())
      spdlog::info("tensorboard: {} (tensorboard --logdir {})", metrics.tensorboard_file(),
                   (fs::path(out_dir) / "tb").string());
    if (main)
      spdlog::info("MFU convention: 6N per token for trained units, 2N for frozen, 4N for a LoRA base, no attention FLOPs; peak: {}",
                   peak_how);
    // Eval sets (periodic: the first eval.max_samples of each; at the end: all).
    std::vector<EvalDataset> eval_sets;
    if (!recipe.data.eval.empty() && (recipe.eval.every > 0 || recipe.eval.at_end))
      eval_sets = load_eval_datasets(recipe, recipe.data.eval);
    // Terminal progress bar between the log lines (rank 0; the log lines are the plain ones).
    ProgressBar bar({"train", "steps", steps_total, main && tty, /*plain_lines=*/false});
    auto run_eval = [&](bool full) {
      sm->optimizer().wait();  // optimizer offload: every host update written back (offload.h)
      EvalOptions o = eval_options(recipe);
      o.max_samples = full ? 0 : recipe.eval.max_samples;
      o.lockstep = dims.distributed();
      o.output_dir = full ? (fs::path(out_dir) / "eval").string() : "";
      o.progress = full && tty;
      o.model_source = model_source;
      o.checkpoint = summary.last_checkpoint;
      o.step = st.step;
      EvalSummary es = evaluate(*model, *tok, recipe, eval_sets, o, &comm);
      nlohmann::json j = {{"step", st.step}, {"eval_full", full}};
      std::string line;
      for (const auto& [k, v] : es.metrics) {
        j[k] = v;
        if (k.rfind("eval/overall/", 0) == 0 && k != "eval/overall/n") line += fmt::format(" | {} {:.4f}", k.substr(13), v);
      }
      metrics.write(j);
      bar.clear();
      if (main)
        spdlog::info("eval ({}, step {}): {} samples in {:.1f} s{}{}", full ? "all samples" : "periodic subset",
                     st.step, es.samples, es.seconds, line, full ? " | wrote " + o.output_dir : "");
    };
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
    auto save = [&](const char* why) {
      const auto t0 = std::chrono::steady_clock::now();
      summary.last_checkpoint = save_checkpoint(out_dir, st, *sm, comm, files, recipe.checkpoint.keep_last);
      if (main)
        spdlog::info("checkpoint ({}) {} in {:.2f} s", why, summary.last_checkpoint,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    };
    int64_t last_saved = st.step;
    double window_seconds = 0, window_wait = 0, window_flops = 0, window_planned = 0;
    int64_t window_steps = 0, window_tokens = 0, window_images = 0, window_samples = 0;
    vlm::collate::PaddingCount window_padding;  // all ranks: micro-batch tokens, padding among them
    bar.restart(st.step);
    const std::string dump_dir = batch_dump_dir();  // VLMTRAIN_DUMP_BATCHES (debugging, parity tests)
    // A step's micro-batches on the host (collate's) and on the device (the model's input).
    struct Staged {
      StepData host;
      std::vector<vlm::Batch> device;
    };
    vlm::sharding::DeviceContext& device_ctx = dims.device_context();
    auto stage = [&](StepData&& sd) {
      auto out = std::make_unique<Staged>();
      for (const auto& mb : sd.micro_batches) out->device.push_back(device_ctx.to_device(mb.batch));
      out->host = std::move(sd);
      return out;
    };
    std::unique_ptr<Staged> staged;

    // ---------------------------------------------------------------- the step loop
    device_ctx.reset_peak();  // the step log's mem: peak tensor bytes over each logging window
    while (st.step < steps_total) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::string ctx = fmt::format("step {}", st.step + 1);

      maybe_fault_exit(st.step + 1, rank);

      // Data: this rank's micro-batches (the same count on every rank), already on the
      // device when the previous step staged them (see "prefetch" below).
      if (!staged) staged = stage(data.next(st.cursor));
      StepData sd = std::move(staged->host);
      std::vector<vlm::Batch> batches = std::move(staged->device);
      staged.reset();
      if (!dump_dir.empty()) dump_micro_batches(dump_dir, st.step + 1, rank, sd.micro_batches);
      int64_t local_sup = 0;
      for (const auto& mb : sd.micro_batches) local_sup += mb.supervised_tokens;
      const int64_t global_sup = vlm::sharding::global_token_count(comm, local_sup);
      const double scale = 1.0 / static_cast<double>(std::max<int64_t>(1, global_sup));

      // Forward + backward per micro-batch; gradients reduce on the last one. No host
      // synchronisation in here: the loss sums on the device, token counts come from the
      // host copies of the micro-batches.
      torch::Tensor loss_acc = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(dims.device()));
      int64_t llm_tokens = 0, patches = 0;
      vlm::collate::PaddingCount padding;  // this rank's micro-batch tokens and padding (host)
      const size_t k_last = sd.micro_batches.size() - 1;
      for (size_t k = 0; k < sd.micro_batches.size(); ++k) {
        const auto& mb = sd.micro_batches[k];
        sm->set_sync(k == k_last);
        vlm::ForwardOutput out = model->forward(batches[k]);
        torch::Tensor loss = out.loss_sum;
        if (k == k_last && inject_nonfinite(st.step + 1, rank)) loss = loss * std::nan("");
        (loss * scale).backward();
        sm->finish_backward(ctx + ", backward");
        loss_acc += loss.detach().to(torch::kFloat64);
        padding += vlm::collate::padding_count(mb);
        if (!mb.filler) {
          llm_tokens += mb.batch.attention_mask.sum().item<int64_t>();  // host tensor
          if (mb.batch.pixel_values.defined()) patches += mb.batch.pixel_values.size(0);
        }
      }
      batches.clear();
      const StepMemory planned = step_memory.step(sd.micro_batches);
      if (main && st.step == 0)
        spdlog::info("memory plan of step 1 (app/plan/step_memory.h): persistent {} + inputs {} + max(gathered units {} "
                     "+ max(loss backward {}, reduce-scatter buffers {} + unit backward {}) + a unit's parameter "
                     "gradient {}, gradients until the optimizer {}) = {} (measured: the step log's mem)",
                     short_bytes(planned.persistent), short_bytes(planned.inputs), short_bytes(planned.gathered),
                     short_bytes(planned.act_head), short_bytes(planned.reduce), short_bytes(planned.act_units),
                     short_bytes(planned.grads), short_bytes(planned.step_grads), short_bytes(planned.total()));
      window_planned = std::max(window_planned, planned.total());

      // Prefetch (CUDA): the next step's micro-batches are read and their host -> device
      // copies issued while this step's kernels still run. On CPU there is nothing to
      // overlap, and waiting for the loader here would hold up the optimizer step.
      if (device_ctx.is_cuda() && st.step + 1 < steps_total) staged = stage(data.next(sd.next));

      // One all-reduce for the step's statistics (and the stop request): the step's one
      // device -> host synchronisation (the loss).
      const double step_flops = flop_model.flops(llm_tokens, patches);
      torch::Tensor stats = torch::tensor({loss_acc.item<double>(), static_cast<double>(sd.samples),
                                           static_cast<double>(sd.images), static_cast<double>(llm_tokens),
                                           step_flops, static_cast<double>(sd.dropped), g_signal.load() != 0 ? 1.0 : 0.0,
                                           static_cast<double>(padding.tokens), static_cast<double>(padding.padding)},
                                          torch::kFloat64);
      comm.all_reduce(stats, ReduceOp::kSum, ctx + ", step statistics");
      auto s = stats.accessor<double, 1>();
      const double loss = s[0] * scale;

      // Clip, guard against non-finite values (same decision on every rank), update.
      const double gnorm = sm->optimizer().clip_grad_norm(ctx + ", grad norm");
      const double lr = recipe.optim.lr * sched.factor(st.step);
      const bool bad = !std::isfinite(loss) || !std::isfinite(gnorm);
      if (bad) {
        ++st.bad_steps;
        ++st.consecutive_bad;
        if (main)
          spdlog::warn("step {}: non-finite {} (loss {}, grad norm {}): update skipped on every rank ({} in a row, "
                       "limit optim.max_bad_steps = {})",
                       st.step + 1, !std::isfinite(loss) ? "loss" : "gradient", loss, gnorm, st.consecutive_bad,
                       recipe.optim.max_bad_steps);
        VLM_CHECK(st.consecutive_bad < recipe.optim.max_bad_steps, "step ", st.step + 1, ": ", st.consecutive_bad,
                  " consecutive non-finite steps (optim.max_bad_steps = ", recipe.optim.max_bad_steps,
                  "); hint: lower optim.lr, raise warmup, or check the data around this step");
      } else {
        sm->optimizer().step(lr / recipe.optim.lr, ctx + ", optimizer");
        ++st.optimizer_steps;
        st.consecutive_bad = 0;
      }
      sm->optimizer().zero_grad();
      ++st.step;
      st.cursor = sd.next;
      st.tokens_seen += global_sup;
      st.samples_seen += static_cast<int64_t>(s[1]);
      st.images_seen += static_cast<int64_t>(s[2]);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      st.train_seconds += dt;
      summary.end_step = st.step;
      summary.last_loss = loss;

      // Log (rank 0): one line per log.every steps, every field also in metrics.jsonl.
      window_seconds += dt;
      window_wait += sd.wait_seconds;
      window_flops += s[4];
      window_steps += 1;
      window_tokens += static_cast<int64_t>(s[3]);
      window_images += static_cast<int64_t>(s[2]);
      window_samples += static_cast<int64_t>(s[1]);
      window_padding += {static_cast<int64_t>(s[7]), static_cast<int64_t>(s[8])};
      if (st.step % recipe.log.every == 0 || st.step == steps_total) {
        const double mfu = peak > 0 ? window_flops / (window_seconds * peak * world) : 0;
        const vlm::sharding::MemoryReport mem = sm->memory();  // this rank's bytes (rank 0 logs)
        const int64_t tensor_peak = device_ctx.memory().peak_allocated;  // device tensors, this window
        const double epoch = static_cast<double>(st.cursor.epoch) +
                             static_cast<double>(st.cursor.offset) / static_cast<double>(data.dataset_size());
        nlohmann::json j = {{"step", st.step},
                            {"epoch", epoch},
                            {"loss", loss},
                            {"grad_norm", gnorm},
                            {"lr", lr},
                            {"skipped", bad},
                            {"supervised_tokens", global_sup},
                            {"tokens_per_s", window_tokens / window_seconds},
                            {"images_per_s", window_images / window_seconds},
                            {"samples_per_s", window_samples / window_seconds},
                            {"mfu", mfu},
                            {"step_s", window_seconds / window_steps},
                            {"data_wait_pct", 100.0 * window_wait / window_seconds},
                            {"micro_batches", sd.micro_batches.size()},
                            {"peak_rss_bytes", peak_rss_bytes()},
                            {"tensor_peak_bytes", tensor_peak},
                            {"tensor_peak_planned_bytes", window_planned},
                            {"mem_params_bytes", mem.param_bytes},
                            {"mem_grads_bytes", mem.grad_bytes},
                            {"mem_optim_bytes", mem.optim_bytes},
                            {"mem_host_optim_bytes", mem.host_optim_bytes},
                            {"mem_gathered_peak_bytes", mem.gathered_peak_bytes},
                            {"dropped_samples", static_cast<int64_t>(s[5])},
                            {"padding_fraction", window_padding.fraction()},
                            {"world_size", world},
                            {"elapsed_s", st.train_seconds}};
        bar.clear();
        if (main)
          spdlog::info("step {:>5}/{} | ep {:.2f} | loss {:.4f} | gnorm {:.3f} | lr {:.2e} | tok/s {:.0f} | img/s {:.1f} "
                       "| smp/s {:.1f} | pad {:.1f}% | mfu {:.2f}% | mem {} (plan {}) | data {:.0f}% | eta {}{}",
                       st.step, steps_total, epoch, loss, gnorm, lr, window_tokens / window_seconds,
                       window_images / window_seconds, window_samples / window_seconds,
                       100 * window_padding.fraction(), 100 * mfu,
                       short_bytes(static_cast<double>(tensor_peak > 0 ? tensor_peak : peak_rss_bytes())),
                       short_bytes(window_planned),
                       100.0 * window_wait / window_seconds,
                       human_seconds(bar.eta_seconds(st.step)), bad ? " | SKIPPED" : "");
        metrics.write(j);
        device_ctx.reset_peak();
        window_seconds = window_wait = window_flops = 0;
        window_steps = window_tokens = window_images = window_samples = 0;
        window_padding = {};
        window_planned = 0;
      }
      bar.update(st.step);

      // Periodic eval on a bounded subset.
      if (!eval_sets.empty() && recipe.eval.every > 0 && st.step % recipe.eval.every == 0 && st.step < steps_total) {
        bar.clear();
        run_eval(false);
      }

      // Checkpoint: periodic, or on SIGINT/SIGTERM (then stop, exit 0).
      const bool stop = s[6] > 0;
      if (stop || (recipe.checkpoint.every > 0 && st.step % recipe.checkpoint.every == 0)) {
        bar.clear();
        save(stop ? "stop requested by a signal" : "periodic");
        last_saved = st.step;
      }
      if (stop) {
        if (main) spdlog::warn("stopping at step {} on a signal; resume with the same command", st.step);
        summary.stopped_by_signal = true;
        break;
      }
    }
    bar.clear();

    // ---------------------------------------------------------------- the end
    if (!summary.stopped_by_signal && recipe.checkpoint.save_final && last_saved != st.step) save("final");
    if (!summary.stopped_by_signal && recipe.eval.at_end && !eval_sets.empty()) run_eval(true);
    comm.barrier("end of training");
    if (main)
      spdlog::info("done: step {} | last loss {:.4f} | {} non-finite step(s) skipped | {} in steps", st.step,
                   summary.last_loss, st.bad_steps, human_seconds(st.train_seconds));
    return summary;
  } catch (const std::exception& e) {
    dims.write_error_file(e.what());
    throw;
  }
}

}  // namespace vlm::app
