// The trainer: `vlmtrain train RECIPE` on one rank. A run, in order (run_training):
//   1. processes   the launcher's environment -> CPU threads -> ParallelDims (the data and
//                  control planes, the mesh) -> logging
//   2. announce    version, planes, the resolved recipe (saved; startup_log.h); every rank
//                  sees run.output_dir (output_dir_probe.h); the seed
//   3. synth data  data.synth renders the training set when it is missing (synth_data.h)
//   4. model       tokenizer + model (on meta with model.sharded_load) -> policies (shard,
//                  materialise this rank's share) -> memory plan (build_model)
//   5. data        TrainData (dataset, sampler, loader) -> the number of steps -> the
//                  ranks' fingerprint check
//   6. resume      the checkpoint's state, optimizer and RNG (Trainer, resume())
//   7. loop set-up lr schedule, FLOP model, metrics.jsonl, eval sets, progress bar, signals
//   8. each step   fault hook -> this rank's micro-batches (prefetched on CUDA) ->
//                  train_step (forward + backward per micro-batch, or the pipeline
//                  stage's part of each in 1F1B order (dist.pp), the one all-reduce of
//                  StepStats, clip, non-finite guard, update) -> log window -> periodic
//                  eval -> checkpoint (checkpointer.h: an asynchronous one in flight is
//                  committed once every rank wrote it; then periodic, or on SIGINT /
//                  SIGTERM, then stop)
//   9. the end     final checkpoint, the wait for one in flight, full eval, barrier, the
//                  summary line
// Every collective of this file is host-side agreement on the control plane
// (dims.control(): Gloo on CPU tensors, whatever the device); parameters and gradients use
// dims.comm() inside sharding/. Every rank makes the same collectives in the same order.
#include "app/train/trainer.h"

#include <ATen/cuda/CUDAContext.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "app/config/model_source.h"
#include "app/config/sharding_options.h"
#include "app/eval/evaluator.h"
#include "app/plan/flop_model.h"
#include "app/plan/memory_plan.h"
#include "app/plan/step_memory.h"
#include "app/report/logging.h"
#include "app/report/metrics_file.h"
#include "app/report/progress.h"
#include "app/train/batch_dump.h"
#include "app/train/checkpoint.h"
#include "app/train/checkpointer.h"
#include "app/train/fault_injection.h"
#include "app/train/log_window.h"
#include "app/train/output_dir_probe.h"
#include "app/train/lr_schedule.h"
#include "app/train/startup_log.h"
#include "sharding/parallel/pipeline.h"
#include "app/train/step_stats.h"
#include "app/train/synth_data.h"
#include "app/train/train_data.h"
#include "sharding/dist/comm.h"
#include "sharding/dist/device_context.h"
#include "sharding/dist/fingerprint.h"
#include "sharding/dist/parallel_dims.h"
#include "sharding/parallel/ddp.h"
#include "sharding/parallel/sharded_model.h"
#include "vlm/runtime/check.h"
#include "vlm/runtime/process_memory.h"

namespace fs = std::filesystem;

namespace vlm::app {
namespace {

// ---------------------------------------------------------------- signals
// SIGINT / SIGTERM ask for a stop: the step in flight finishes, every rank learns of it
// through the step statistics, a checkpoint is written, and the run ends with exit 0.
std::atomic<int> g_signal{0};
extern "C" void on_stop_signal(int sig) {
  g_signal.store(sig);
  std::signal(sig, SIG_DFL);  // a second signal ends the process the usual way
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---------------------------------------------------------------- processes
// One share of the cores per local rank, unless OMP_NUM_THREADS says otherwise.
void set_cpu_threads(const vlm::sharding::DistEnv& env) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) return;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(std::max(1, hw / std::max(1, env.local_world_size)));
}

// ---------------------------------------------------------------- model + policies
// The model this rank trains, sharded by the recipe's policies.
struct TrainModel {
  vlm::VisionLanguageModel model{nullptr};
  std::unique_ptr<vlm::Tokenizer> tok;
  vlm::VlmConfig cfg;
  std::string source;  // where the weights came from (LoadedModel::description)
  std::unique_ptr<vlm::sharding::ShardedModel> sm;
  std::unique_ptr<StepMemoryModel> step_memory;  // the step log's "plan": memory plan + micro-batches
};

// Collective (apply_policies). Loads the tokenizer and the model (on meta with
// model.sharded_load: the policies then materialise only this rank's share), applies the
// policies, plans the memory, and logs each part on rank 0.
TrainModel build_model(const Recipe& recipe, vlm::sharding::ParallelDims& dims) {
  const bool main = dims.is_main();
  const torch::Dtype param_dtype = recipe_dtype(recipe.precision.param_dtype);
  const int64_t rss_before_model = current_rss_bytes();
  dims.device_context().reset_peak();
  const int64_t device_before = dims.device_context().memory().allocated;
  LoadModelOptions load_opts{static_cast<uint64_t>(recipe.run.seed), dims.device(), param_dtype};
  load_opts.deferred = recipe.model.sharded_load;  // built on meta; apply_policies materialises this rank's share
  load_opts.tp = dims.tp();                         // tensor parallelism: this rank's slices
  load_opts.tp_rank = dims.tp_rank();
  LoadedModel lm = load_model(recipe.model, load_opts, recipe.source);
  TrainModel m;
  m.model = lm.model;
  m.tok = std::move(lm.tokenizer);
  m.cfg = m.model->cfg;
  m.source = lm.description;
  m.model->train();
  if (main) spdlog::info("model: {} | {}", vlm::family_name(m.cfg.family), m.source);

  m.sm = vlm::sharding::apply_policies(*m.model, sharding_options(recipe), dims, lm.source.get());
  lm.source.reset();  // unmaps the checkpoint
  const vlm::sharding::ShardingOptions so = sharding_options(recipe);
  MemoryPlan plan = plan_memory(m.sm->unit_table(), dims.comm().world_size(), so.param_dtype, so.reduce_dtype,
                                so.fsdp_accumulate_unsharded, dims.has_mesh() ? dims.dp_shard() : 0);
  if (so.optimizer_offload) plan_offload(plan, m.sm->unit_table());  // optimizer bytes -> host
  log_sharded_load(m.sm->load_stats(), m.sm->memory(), plan, rss_before_model, device_before, dims, lm.random_init,
                   recipe.model.sharded_load);
  m.step_memory = std::make_unique<StepMemoryModel>(
      *m.model, plan, m.sm->unit_table(), so.param_dtype,
      dims.device().is_cuda() ? AttentionPath::cuda : AttentionPath::cpu,
      recipe.data.prefetch * recipe.batch.samples_per_rank);
  m.step_memory->set_context_parallel(dims.cp(), so.cp_mode == "ring");
  if (dims.device().is_cuda())
    m.step_memory->set_workspace(
        training_blas_workspace_bytes(at::cuda::getDeviceProperties(dims.device().index())->major));
  log_unit_table(*m.sm, plan, main);
  log_pipeline_stages(*m.model, dims);
  return m;
}

// ---------------------------------------------------------------- data
int64_t total_steps(const Recipe& r, int64_t steps_per_epoch) {
  if (r.schedule.steps > 0) return r.schedule.steps;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(r.schedule.epochs * static_cast<double>(steps_per_epoch))));
}

// Collective: every rank has the same recipe, model config, unit table and data set size
// (sharding/dist/fingerprint.h), or every rank throws naming the difference.
void check_same_run(vlm::sharding::Comm& comm, const Recipe& recipe, const TrainModel& m, const TrainData& data) {
  vlm::sharding::check_fingerprint(
      comm, vlm::sharding::Fingerprint::standard(recipe_hash(recipe), vlm::to_hf_json(m.cfg).dump(),
                                                 vlm::sharding::unit_table_text(m.sm->layout_table()),
                                                 data.dataset_size()));
}

// ---------------------------------------------------------------- resume
// The state to start from: the checkpoint of checkpoint.resume (its optimizer state loaded
// into sm, and on the same world size this rank's RNG states, rng_state.h), or a fresh one.
TrainerState resume(const Recipe& recipe, vlm::sharding::ShardedModel& sm, vlm::sharding::ParallelDims& dims) {
  TrainerState st;
  const std::optional<std::string> from = resolve_resume(recipe.checkpoint.resume, recipe.run.output_dir);
  if (!from) return st;
  CheckpointReader ck(*from);
  st = ck.state();
  sm.load_state(ck.reader(), st.optimizer_steps);
  const RngRestore rng = restore_rng_states(ck, dims.rank(), dims.world_size(), dims.device());
  if (dims.is_main()) {
    std::string restored;
    for (const auto& k : rng.restored) restored += (restored.empty() ? "" : ", ") + k;
    spdlog::info("resumed from {} at step {} (written by {} rank(s), now {}), data cursor epoch {} offset {}, RNG "
                 "states restored: {}",
                 *from, st.step, ck.world_size(), dims.world_size(), st.cursor.epoch, st.cursor.offset,
                 restored.empty() ? std::string("none") : restored);
    for (const auto& line : rng.differs) spdlog::warn("resume: {}", line);
    if (ck.recipe_hash() != recipe_hash(recipe))
      spdlog::warn("the checkpoint was written by a recipe with another hash ({} vs {}): see its recipe.toml",
                   ck.recipe_hash(), recipe_hash(recipe));
  }
  return st;
}

// ---------------------------------------------------------------- the step
// What one step did, for the log window and the summary.
struct StepResult {
  StepStats stats;                // summed over ranks
  int64_t supervised_tokens = 0;  // global: the loss's denominator
  double loss = 0;                // token-weighted global mean
  double grad_norm = 0;
  double lr = 0;
  bool skipped = false;           // non-finite loss or gradient: no update on any rank
  StepMemory planned;             // planned peak of this rank's micro-batches
};

// The step loop's objects. The constructor resumes and sets the loop up: the members in
// their order, then metrics.jsonl (+ TensorBoard), the eval sets, the signal handlers.
// run_training's loop calls the methods and advances `st`; the references point at
// run_training's set-up objects.
struct Trainer {
  Trainer(const Recipe& recipe, vlm::sharding::ParallelDims& dims, TrainModel& m, TrainData& data, int64_t steps_total);

  StepResult train_step(StagedStep& in, const std::string& ctx);
  void log_step(const StepResult& r, const StepData& sd);
  void run_eval(bool full);
  void save(const char* why);
  void poll_checkpoint();
  void finish_checkpoint(const char* when);

  const Recipe& recipe;
  vlm::sharding::ParallelDims& dims;
  vlm::sharding::Comm& comm;  // control plane
  vlm::sharding::DeviceContext& device;
  TrainModel& m;
  TrainData& data;
  const int64_t steps_total;
  const bool main, tty;
  const std::string out_dir;
  bool blas_logged = false;  // the cuBLAS workspaces line (CUDA, first logged step)
  CheckpointFiles files;
  Checkpointer checkpointer;
  TrainerState st;
  TrainSummary summary;
  int64_t last_saved = 0;  // step of the last checkpoint written or resumed from
  LrSchedule sched;
  FlopModel flop_model;
  std::string peak_how;
  double peak = 0;  // peak FLOP/s per rank (0: unknown)
  std::optional<MetricsFile> metrics;
  std::vector<EvalDataset> eval_sets;  // periodic: the first eval.max_samples of each; at the end: all
  ProgressBar bar;  // rank 0 on a terminal, between the log lines (which are the plain ones)
  LogWindow window;
  const std::string dump_dir;  // VLMTRAIN_DUMP_BATCHES (debugging, parity tests)
  StepFeed feed;

  struct MicroBatchSums;
  MicroBatchSums forward_backward(const StepData& sd, std::vector<vlm::Batch>& batches, double scale,
                                  const std::string& ctx);
  void pipeline_forward_backward(std::vector<vlm::Batch>& batches, double scale, const std::string& ctx,
                                 torch::Tensor& loss);
  std::unique_ptr<vlm::sharding::PipelineSchedule> pipe;  // pipeline parallelism (dist.pp > 1)
  void optimizer_step(StepResult& r, const std::string& ctx);
};

Trainer::Trainer(const Recipe& recipe_, vlm::sharding::ParallelDims& dims_, TrainModel& m_, TrainData& data_,
                 int64_t steps_total_)
    : recipe(recipe_),
      dims(dims_),
      comm(dims_.control()),
      device(dims_.device_context()),
      m(m_),
      data(data_),
      steps_total(steps_total_),
      main(dims_.is_main()),
      tty(dims_.is_main() && isatty(STDERR_FILENO)),
      out_dir(recipe_.run.output_dir),
      files{to_toml(recipe_), recipe_hash(recipe_), vlm::to_hf_json(m_.cfg).dump(2),
            fs::absolute(tokenizer_path(recipe_.model, recipe_.source)).string()},
      checkpointer({out_dir, files, recipe_.checkpoint.keep_last, recipe_.checkpoint.async, dims_.device(),
                    /*log=*/true},  // every rank; info lines of ranks > 0 show with log.all_ranks
                   *m_.sm, comm),
      st(resume(recipe_, *m_.sm, dims_)),
      sched{steps_total_, recipe_.schedule.warmup_steps, recipe_.schedule.decay, recipe_.schedule.min_lr_ratio},
      flop_model(m_.sm->unit_table(), m_.cfg),
      peak(peak_flops_per_rank(dims_.device(), recipe_dtype(recipe_.precision.param_dtype), &peak_how)),
      bar({"train", "steps", steps_total_, main && tty, /*plain_lines=*/false}),
      window({recipe_.log.every, steps_total_, dims_.world_size(), peak}),
      dump_dir(batch_dump_dir()),
      feed(data_, dims_.device_context(), dims_.pp_rank() == 0) {
  summary.start_step = summary.end_step = last_saved = st.step;
  metrics.emplace(out_dir, main, recipe.log.tensorboard, st.step + 1);
  if (main && !metrics->tensorboard_file().empty())
    spdlog::info("tensorboard: {} (tensorboard --logdir {})", metrics->tensorboard_file(),
                 (fs::path(out_dir) / "tb").string());
  if (main)
    spdlog::info("MFU convention: 6N per token for trained units, 2N for frozen, 4N for a LoRA base, no attention FLOPs (Gated DeltaNet: the chunked rule's matmuls counted, 3x trained); peak: {}",
                 peak_how);
  if (!recipe.data.eval.empty() && (recipe.eval.every > 0 || recipe.eval.at_end))
    eval_sets = load_eval_datasets(recipe, recipe.data.eval);
  if (dims.pp() > 1)
    pipe = std::make_unique<vlm::sharding::PipelineSchedule>(
        dims, m.cfg.text.hidden_size,
        torch::TensorOptions().dtype(recipe_dtype(recipe.precision.param_dtype)).device(dims.device()));
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  bar.restart(st.step);
}

// This rank's sums over its micro-batches, kept on the device (loss) or counted on the host.
struct Trainer::MicroBatchSums {
  torch::Tensor loss;  // [] float64 on the device: sum of the micro-batches' summed token losses
  int64_t llm_tokens = 0, patches = 0;  // non-filler micro-batches
  vlm::collate::PaddingCount padding;   // micro-batch tokens and padding among them
};

// Forward + backward per micro-batch, the loss scaled by `scale` (1 / global supervised
// tokens); gradients reduce on the last one. No host synchronisation in here: the loss sums
// on the device, token counts come from the host copies of the micro-batches. Pipeline
// parallelism: the stage's part of each micro-batch in 1F1B order (pipeline_forward_backward).
Trainer::MicroBatchSums Trainer::forward_backward(const StepData& sd, std::vector<vlm::Batch>& batches, double scale,
                                                  const std::string& ctx) {
  MicroBatchSums sums;
  sums.loss = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(dims.device()));
  if (pipe) {
    pipeline_forward_backward(batches, scale, ctx, sums.loss);
  } else {
    const size_t k_last = sd.micro_batches.size() - 1;
    // MoE load-balancing loss: its mean over the step's micro-batches on all ranks (the same
    // count on every rank, invariant 1; a filler's counts as 0), times the coefficient.
    const double aux_weight = recipe.model.router_aux_loss_coef /
                              static_cast<double>(sd.micro_batches.size() * static_cast<size_t>(dims.world_size()));
    for (size_t k = 0; k < sd.micro_batches.size(); ++k) {
      m.sm->set_sync(k == k_last);
      batches[k].router_aux_weight = sd.micro_batches[k].filler ? 0.0 : aux_weight;
      vlm::ForwardOutput out = m.model->forward(batches[k]);
      torch::Tensor loss = out.loss_sum;
      if (k == k_last && inject_nonfinite(st.step + 1, dims.rank())) loss = loss * std::nan("");
      (loss * scale).backward();
      m.sm->finish_backward(ctx + ", backward");
      sums.loss += loss.detach().to(torch::kFloat64);
    }
  }
  for (const auto& mb : sd.micro_batches) {
    sums.padding += vlm::collate::padding_count(mb);
    if (!mb.filler) {
      sums.llm_tokens += mb.batch.attention_mask.sum().item<int64_t>();  // host tensor
      if (mb.batch.pixel_values.defined()) sums.patches += mb.batch.pixel_values.size(0);
    }
  }
  return sums;
}

// The 1F1B schedule over this rank's micro-batches (sharding/parallel/pipeline.h): the last
// stage's loss sums into `loss` (the other stages add nothing); gradients reduce after the
// last micro-batch's backward.
void Trainer::pipeline_forward_backward(std::vector<vlm::Batch>& batches, double scale, const std::string& ctx,
                                        torch::Tensor& loss) {
  const int64_t n = static_cast<int64_t>(batches.size());
  const bool last = m.sm->pipeline_stage().last();
  vlm::sharding::PipelineStep ps;
  ps.micro_batches = n;
  ps.rows_and_length = [&](int64_t k) { return std::make_pair(batches[k].input_ids.size(0), batches[k].input_ids.size(1)); };
  ps.forward = [&](int64_t k, const torch::Tensor& input) {
    vlm::VisionLanguageModelImpl::StageOutput o = m.model->forward_stage(batches[k], input);
    if (!last) return o.hidden;
    torch::Tensor l = o.out.loss_sum;
    if (k == n - 1 && inject_nonfinite(st.step + 1, dims.rank())) l = l * std::nan("");
    loss += l.detach().to(torch::kFloat64);
    return l * scale;
  };
  ps.before_backward = [&](int64_t k) { m.sm->set_sync(k == n - 1); };
  ps.after_backward = [&](int64_t) { m.sm->finish_backward(ctx + ", backward"); };
  pipe->run(ps, ctx);
}

// Clip, guard against non-finite values (the same decision on every rank: the loss and the
// norm are global), update or skip; then zero the gradients. Throws after
// optim.max_bad_steps non-finite steps in a row.
void Trainer::optimizer_step(StepResult& r, const std::string& ctx) {
  r.grad_norm = m.sm->optimizer().clip_grad_norm(ctx + ", grad norm");
  r.lr = recipe.optim.lr * sched.factor(st.step);
  r.skipped = !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
  if (r.skipped) {
    ++st.bad_steps;
    ++st.consecutive_bad;
    if (main)
      spdlog::warn("step {}: non-finite {} (loss {}, grad norm {}): update skipped on every rank ({} in a row, "
                   "limit optim.max_bad_steps = {})",
                   st.step + 1, !std::isfinite(r.loss) ? "loss" : "gradient", r.loss, r.grad_norm, st.consecutive_bad,
                   recipe.optim.max_bad_steps);
    VLM_CHECK(st.consecutive_bad < recipe.optim.max_bad_steps, "step ", st.step + 1, ": ", st.consecutive_bad,
              " consecutive non-finite steps (optim.max_bad_steps = ", recipe.optim.max_bad_steps,
              "); hint: lower optim.lr, raise warmup, or check the data around this step");
  } else {
    m.sm->optimizer().step(r.lr / recipe.optim.lr, ctx + ", optimizer");
    ++st.optimizer_steps;
    st.consecutive_bad = 0;
  }
  m.sm->optimizer().zero_grad();
}

// One optimizer step on this rank's staged micro-batches (their device copies are freed
// after backward): global token count, forward + backward, the next step's prefetch
// (CUDA), one all-reduce of StepStats (the step's one device -> host synchronisation: the
// loss), then the optimizer. Advances st past the step (all but train_seconds).
StepResult Trainer::train_step(StagedStep& in, const std::string& ctx) {
  const StepData& sd = in.host;
  // Context / tensor parallelism: the ranks of a group share their micro-batches; each shares
  // the loss (its chunk's part, or 1 / tp of it), one of them counts what the micro-batches hold.
  // Pipeline parallelism: every stage has them, stage 0 counts them, each stage its own FLOPs.
  const bool counts = dims.cp_rank() == 0 && dims.tp_rank() == 0 && dims.pp_rank() == 0;
  const bool counts_flops = dims.cp_rank() == 0 && dims.tp_rank() == 0;
  int64_t local_sup = 0;
  for (const auto& mb : sd.micro_batches) local_sup += counts ? mb.supervised_tokens : 0;
  StepResult r;
  r.supervised_tokens = vlm::sharding::global_token_count(comm, local_sup);
  const double scale = 1.0 / static_cast<double>(std::max<int64_t>(1, r.supervised_tokens));

  MicroBatchSums sums = forward_backward(sd, in.device, scale, ctx);
  in.device.clear();
  r.planned = m.step_memory->step(sd.micro_batches);
  if (st.step == 0) log_step_memory_plan(r.planned, main);
  if (device.is_cuda() && st.step + 1 < steps_total) feed.prefetch(sd.next);

  StepStats local;
  local.loss_sum = sums.loss.item<double>();
  local.stop_requests = g_signal.load() != 0 ? 1 : 0;
  if (counts) {
    local.samples = sd.samples;
    local.images = sd.images;
    local.llm_tokens = sums.llm_tokens;

    local.dropped = sd.dropped;
    local.padding_tokens = sums.padding.tokens;
    local.padding = sums.padding.padding;
  }
  if (counts_flops) local.flops = flop_model.flops(sums.llm_tokens, sums.patches);
  r.stats = reduce_step_stats(comm, local, ctx);
  r.loss = r.stats.loss_sum * scale;

  optimizer_step(r, ctx);
  ++st.step;
  st.cursor = sd.next;
  st.tokens_seen += r.supervised_tokens;
  st.samples_seen += r.stats.samples;
  st.images_seen += r.stats.images;
  return r;
}

// The window's line (rank 0) and metrics.jsonl object; then a new window of device peaks.
void Trainer::log_step(const StepResult& r, const StepData& sd) {
  const vlm::sharding::MemoryReport mem = m.sm->memory();  // this rank's bytes (rank 0 logs)
  const vlm::sharding::DeviceMemory dm = device.memory();
  const int64_t tensor_peak = dm.peak_allocated;  // device tensors, this window
  if (main && dm.blas_workspaces > 0 && !blas_logged) {  // CUDA: the plan's workspace term, measured
    spdlog::info("cuBLAS / cuBLASLt workspaces held: {} ({}); the memory plan counts {}", dm.blas_workspaces,
                 human_bytes(static_cast<double>(dm.blas_workspace_bytes)), human_bytes(r.planned.workspace));
    blas_logged = true;
  }
  StepFacts f;
  f.step = st.step;
  f.epoch = static_cast<double>(st.cursor.epoch) +
            static_cast<double>(st.cursor.offset) / static_cast<double>(data.dataset_size());
  f.loss = r.loss;
  f.grad_norm = r.grad_norm;
  f.lr = r.lr;
  f.skipped = r.skipped;
  f.supervised_tokens = r.supervised_tokens;
  f.micro_batches = sd.micro_batches.size();
  f.pipeline_bubble = vlm::pipeline_bubble(dims.pp(), static_cast<int64_t>(sd.micro_batches.size()));
  f.dropped_samples = r.stats.dropped;
  f.elapsed_s = st.train_seconds;
  window.write(f, mem, tensor_peak, bar, *metrics, main);
  device.reset_peak();
}

// Collective. Evaluates the eval sets (full: all samples, predictions written under
// <output_dir>/eval; else the periodic subset), writes the metrics object, logs a line.
void Trainer::run_eval(bool full) {
  m.sm->optimizer().wait();  // optimizer offload: every host update written back (offload.h)
  EvalOptions o = eval_options(recipe);
  o.max_samples = full ? 0 : recipe.eval.max_samples;
  o.lockstep = dims.distributed();
  o.output_dir = full ? (fs::path(out_dir) / "eval").string() : "";
  o.progress = full && tty;
  o.model_source = m.source;
  o.checkpoint = summary.last_checkpoint;
  o.step = st.step;
  EvalSummary es = evaluate(*m.model, *m.tok, recipe, eval_sets, o, &comm);
  nlohmann::json j = {{"step", st.step}, {"eval_full", full}};
  std::string line;
  for (const auto& [k, v] : es.metrics) {
    j[k] = v;
    if (k.rfind("eval/overall/", 0) == 0 && k != "eval/overall/n") line += fmt::format(" | {} {:.4f}", k.substr(13), v);
  }
  metrics->write(j);
  bar.clear();
  if (main)
    spdlog::info("eval ({}, step {}): {} samples in {:.1f} s{}{}", full ? "all samples" : "periodic subset", st.step,
                 es.samples, es.seconds, line, full ? " | wrote " + o.output_dir : "");
}

// Collective. Saves the checkpoint of the current step (checkpointer.h: written before it
// returns, or with checkpoint.async in the background) and logs it.
void Trainer::save(const char* why) {
  if (auto c = checkpointer.save(st, why)) summary.last_checkpoint = c->dir;
  last_saved = st.step;
}

// Collective at every step end: checkpoint.async's save in flight, if any, is committed once
// every rank's files are written (one all-reduce per step while one is in flight).
void Trainer::poll_checkpoint() {
  if (checkpointer.pending()) bar.clear();  // a commit logs a line
  if (auto c = checkpointer.poll(st.step)) summary.last_checkpoint = c->dir;
}

// Collective: waits for checkpoint.async's save in flight, if any, and commits it.
void Trainer::finish_checkpoint(const char* when) {
  if (auto c = checkpointer.finish(when)) summary.last_checkpoint = c->dir;
}

}  // namespace

TrainSummary run_training(const Recipe& recipe) {
  // ---------------------------------------------------------------- processes
  const vlm::sharding::DistEnv env = vlm::sharding::detect_dist_env(vlm::sharding::process_env());
  set_cpu_threads(env);
  vlm::sharding::ParallelDims dims = vlm::sharding::ParallelDims::init(env, parallel_options(recipe));
  init_logging(dims.rank(), dims.world_size(), recipe.log.level, recipe.log.all_ranks);
  try {
    vlm::sharding::Comm& comm = dims.control();
    const bool main = dims.is_main();
    announce_run(recipe, env, dims);
    check_output_dir_shared(recipe.run.output_dir, comm);  // every rank sees it, or every rank stops here
    torch::manual_seed(static_cast<uint64_t>(recipe.run.seed) * 7919 + static_cast<uint64_t>(dims.rank()));
    ensure_synth_data(recipe, comm, main);

    // ---------------------------------------------------------------- model + policies
    TrainModel m = build_model(recipe, dims);

    // ---------------------------------------------------------------- data
    TrainData data(recipe, *m.tok, m.cfg, dims.rank(), dims.world_size(), [&] { comm.barrier("dataset index caches"); },
                   [](const std::string& w) { spdlog::warn("{}", w); }, dims.data_group_size(), dims.pp());
    const int64_t steps_total = total_steps(recipe, data.steps_per_epoch());
    log_data(recipe, data, steps_total, dims);
    check_same_run(comm, recipe, m, data);

    // ---------------------------------------------------------------- resume, loop set-up
    Trainer t(recipe, dims, m, data, steps_total);
    TrainerState& st = t.st;

    // ---------------------------------------------------------------- the step loop
    t.device.reset_peak();  // the step log's mem: peak tensor bytes over each logging window
    while (st.step < steps_total) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::string ctx = fmt::format("step {}", st.step + 1);
      maybe_fault_exit(st.step + 1, dims.rank());

      // This rank's micro-batches (the same count on every rank), on the device.
      StagedStep in = t.feed.take(st.cursor);
      if (!t.dump_dir.empty()) dump_micro_batches(t.dump_dir, st.step + 1, dims.rank(), in.host.micro_batches);
      const StepResult r = t.train_step(in, ctx);
      const double dt = seconds_since(t0);
      st.train_seconds += dt;
      t.summary.end_step = st.step;
      t.summary.last_loss = r.loss;

      // Log (rank 0): one line per log.every steps, every field also in metrics.jsonl.
      t.window.add(r.stats, dt, in.host.wait_seconds, r.planned.total());
      if (t.window.due(st.step)) t.log_step(r, in.host);
      t.bar.update(st.step);

      // Periodic eval on a bounded subset.
      if (!t.eval_sets.empty() && recipe.eval.every > 0 && st.step % recipe.eval.every == 0 && st.step < steps_total) {
        t.bar.clear();
        t.run_eval(false);
      }

      // Checkpoint: periodic, or on SIGINT/SIGTERM (then stop, exit 0). With checkpoint.async
      // the save returns after copying the state; poll commits it at a later step end.
      t.poll_checkpoint();
      const bool stop = r.stats.stop();
      if (stop || (recipe.checkpoint.every > 0 && st.step % recipe.checkpoint.every == 0)) {
        t.bar.clear();
        t.save(stop ? "stop requested by a signal" : "periodic");
      }
      if (stop) {
        if (main) spdlog::warn("stopping at step {} on a signal; resume with the same command", st.step);
        t.summary.stopped_by_signal = true;
        break;
      }
    }
    t.bar.clear();

    // ---------------------------------------------------------------- the end
    if (!t.summary.stopped_by_signal && recipe.checkpoint.save_final && t.last_saved != st.step) t.save("final");
    t.finish_checkpoint(t.summary.stopped_by_signal ? "before stopping" : "at the end of training");
    if (!t.summary.stopped_by_signal && recipe.eval.at_end && !t.eval_sets.empty()) t.run_eval(true);
    comm.barrier("end of training");
    if (main)
      spdlog::info("done: step {} | last loss {:.4f} | {} non-finite step(s) skipped | {} in steps", st.step,
                   t.summary.last_loss, st.bad_steps, human_seconds(st.train_seconds));
    return t.summary;
  } catch (const std::exception& e) {
    dims.write_error_file(e.what());
    throw;
  }
}

}  // namespace vlm::app
