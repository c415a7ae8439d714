// apply_policies and the pieces it composes (see sharded_model.h for the order).
#include "sharding/parallel/sharded_model.h"

#include <algorithm>

#include "sharding/parallel/activation_checkpoint.h"
#include "sharding/parallel/context_parallel.h"
#include "sharding/parallel/fsdp.h"
#include "sharding/parallel/lora.h"
#include "sharding/parallel/pipeline.h"
#include "sharding/parallel/sharded_load.h"
#include "sharding/parallel/tensor_parallel.h"
#include "vlm/runtime/check.h"
#include "vlm/model/recompute_tail.h"
#include "vlm/model/tensor_parallel.h"

namespace vlm::sharding {

void apply_freeze(const std::vector<UnitPlan>& units) {
  for (const auto& u : units)
    if (!u.trainable())
      for (const auto& p : u.params) {
        auto t = p.param;
        t.set_requires_grad(false);
        t.mutable_grad() = torch::Tensor();
      }
}

namespace {
void add_names(std::vector<std::string>& out, const UnitPlan& u) {
  out.push_back(u.path);
  size_t start = 0;  // aliases: comma-separated
  while (start < u.aliases.size()) {
    const size_t comma = u.aliases.find(',', start);
    out.push_back(u.aliases.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}
bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}
}  // namespace

PolicyRunner::PolicyRunner(const std::vector<UnitPlan>& units, FsdpEngine* fsdp) : fsdp_(fsdp) {
  for (const auto& u : units) {
    if (!u.trainable() && !u.has_adapters && !u.has_experts) add_names(frozen_, u);
    if (u.checkpointed) add_names(checkpointed_, u);
  }
}

torch::Tensor PolicyRunner::run(const std::string& path, torch::nn::Module& unit, const torch::Tensor& x_in,
                                const std::function<torch::Tensor(const torch::Tensor&)>& fn) {
  if (before_call_) before_call_();
  FsdpEngine* fsdp = fsdp_;
  if (fsdp != nullptr) fsdp->pre_forward(path);  // gather (no-op for other units)
  // The post-backward signal on the input (frees the unit when its backward is over).
  const torch::Tensor x = fsdp != nullptr ? fsdp->mark_input(path, x_in) : x_in;
  torch::Tensor out;
  if (contains(frozen_, path) && !(x.defined() && x.requires_grad())) {
    // Nothing below this unit needs a gradient and its own parameters take none.
    torch::NoGradGuard no_grad;
    ++no_grad_calls_;
    out = fn(x);
  } else if (torch::GradMode::is_enabled() && contains(checkpointed_, path)) {
    std::function<void()> before_recompute;
    if (fsdp != nullptr && fsdp->find(path) != nullptr) {
      const int64_t pos = fsdp->position(path);
      before_recompute = [fsdp, pos] { fsdp->pre_backward(pos); };
    }
    ++checkpointed_calls_;
    // The recompute differentiates the output without reading it: the unit may skip its
    // last matmul (vlm/model/recompute_tail.h).
    auto recompute = [fn, u = static_cast<const torch::nn::Module*>(&unit)](const torch::Tensor& xr) {
      vlm::RecomputeTail tail(u);
      return fn(xr);
    };
    out = checkpoint_unit(x, unit.parameters(), fn, std::move(before_recompute), recompute);
  } else {
    out = fn(x);
  }
  if (fsdp != nullptr) out = fsdp->post_forward(path, out);  // free / pre-backward hook
  return out;
}

ShardedModel::~ShardedModel() {
  if (runner_) runner_->set_before_call(nullptr);  // the runner may outlive the optimizer
  if (fsdp_) fsdp_->set_before_gather(nullptr);
  if (runner_) runner_->detach_fsdp();
}

void ShardedModel::set_sync(bool sync) {
  if (reducer_) reducer_->set_sync(sync);
  if (expert_reducer_) expert_reducer_->set_sync(sync);
  if (fsdp_) fsdp_->set_sync(sync);
}

void ShardedModel::finish_backward(const std::string& ctx) {
  if (reducer_) reducer_->finish_backward(ctx);
  if (expert_reducer_) expert_reducer_->finish_backward(ctx + ", experts");
  if (fsdp_) fsdp_->finish_backward(ctx);
}

MemoryReport ShardedModel::memory() const {
  MemoryReport m;
  for (const auto& u : units_) {
    FsdpUnit* f = fsdp_ ? fsdp_->find_unit(u.path) : nullptr;
    if (f != nullptr) {
      m.param_bytes += f->shard_param_bytes();
      m.grad_bytes += f->shard_grad_bytes();
      continue;
    }
    for (const auto& p : u.params)
      m.param_bytes += static_cast<double>(p.param.numel()) * static_cast<double>(p.param.element_size());
  }
  // Trainable replicated / ZeRO-1 units: the DDP bucket buffers (reduce dtype) plus the .grad
  // it keeps (param dtype; none when the gradients accumulate in the buckets, ddp.h).
  if (reducer_) m.grad_bytes += reducer_->buffer_bytes() + reducer_->kept_grad_bytes();
  if (expert_reducer_) m.grad_bytes += expert_reducer_->buffer_bytes() + expert_reducer_->kept_grad_bytes();
  const double optim = 4.0 * static_cast<double>(optimizer_->state_numel());
  if (optimizer_->offload_queue() != nullptr) {  // master + m + v, plus grad staging of master's size
    m.host_optim_bytes = optim * 4.0 / 3.0;
  } else {
    m.optim_bytes = optim;
  }
  if (fsdp_) {
    const GatherStats& g = fsdp_->gather_stats();
    m.gathered_bytes = g.bytes;
    m.gathered_peak_bytes = g.peak_bytes;
    m.gathered_peak_units = g.peak_units;
    m.reduce_scatter_peak_bytes = g.rs_peak_bytes;
    m.unsharded_accum_peak_bytes = g.acc_peak_bytes;
  }
  return m;
}

void ShardedModel::reset_gather_peak() {
  if (fsdp_) fsdp_->reset_peak();
}

std::vector<StateSlice> ShardedModel::state_slices() const {
  torch::NoGradGuard no_grad;
  std::vector<StateSlice> out = optimizer_->state_slices();
  for (const auto& u : units_) {
    if (u.trainable() || !stores_frozen()) continue;
    const auto [lo, hi] = owned_range(u.numel, world_, rank_);
    if (FsdpUnit* f = fsdp_ ? fsdp_->find_unit(u.path) : nullptr) {
      // Sharded: this rank's part of its shard R_r (under hybrid_shard its replica's share, so
      // the replicas of a shard write it once between them).
      const int64_t a = f->own_lo(), b = f->own_hi();
      out.push_back({u.path + "/param", u.numel, a, b,
                     f->shard_param().narrow(0, a - f->lo(), b - a).to(torch::kCPU).clone()});
      continue;
    }
    StateSlice s{u.path + "/param", u.numel, lo, hi, torch::empty({hi - lo}, u.params.front().param.options().device(torch::kCPU))};
    int64_t off = 0;
    for (const auto& p : u.params) {
      const int64_t a = std::max(lo, off), b = std::min(hi, off + p.param.numel());
      if (a < b) s.data.narrow(0, a - lo, b - a).copy_(p.param.detach().reshape({-1}).narrow(0, a - off, b - a));
      off += p.param.numel();
    }
    out.push_back(std::move(s));
  }
  if (!stage_.whole() && !stage_.first())  // the tied embedding: stage 0 writes it
    out.erase(std::remove_if(out.begin(), out.end(),
                             [](const StateSlice& s) { return s.key.rfind("model.embed_tokens/", 0) == 0; }),
              out.end());
  if (tp_ > 1)
    for (auto& s : out) s.key = vlm::str("tp", tp_rank_, "of", tp_, "/", s.key);
  return out;
}

// Tensor parallelism: the checkpoint's vectors of this tp rank ("tp<r>of<n>/<key>") when it
// was written with the same tp; otherwise parameter by parameter, each whole parameter's
// state (as the reader serves "<param>/<kind>") cut to this rank's slice (the last one kept).
StateReader ShardedModel::tensor_parallel_reader(const StateReader& reader) const {
  const std::string prefix = vlm::str("tp", tp_rank_, "of", tp_, "/");
  auto shapes = std::make_shared<std::map<std::string, std::vector<int64_t>>>();
  for (const auto& u : units_)
    for (const auto& p : u.params) (*shapes)[p.name] = p.param.sizes().vec();
  auto cache = std::make_shared<std::pair<std::string, torch::Tensor>>();
  auto split_key = [](const std::string& key) {
    const size_t slash = key.rfind('/');
    return slash == std::string::npos ? std::make_pair(key, std::string())
                                      : std::make_pair(key.substr(0, slash), key.substr(slash + 1));
  };
  auto own = [reader, prefix](const std::string& key) { return reader.numel && reader.numel(prefix + key) >= 0; };
  StateReader::Numel numel = [reader, prefix, shapes, split_key](const std::string& key) -> int64_t {
    if (reader.numel) {
      const int64_t n = reader.numel(prefix + key);
      if (n >= 0) return n;
    }
    const auto [param, kind] = split_key(key);
    const auto it = shapes->find(param);
    if (it == shapes->end()) return -1;  // another tp's unit vector: load parameter by parameter
    if (kind == "step") return reader.numel ? reader.numel(key) : 1;
    int64_t n = 1;
    for (int64_t d : it->second) n *= d;
    return n;
  };
  StateReader::Read read = [reader, prefix, shapes, cache, split_key, own, cfg = cfg_, tp = tp_,
                            rank = tp_rank_](const std::string& key, int64_t lo, int64_t hi) -> torch::Tensor {
    if (own(key) || !reader.numel) return reader.read(prefix + key, lo, hi);
    const auto [param, kind] = split_key(key);
    const vlm::TpSplit split = vlm::tensor_parallel_split(cfg, param, tp);
    if (kind == "step" || !split.split() || !shapes->count(param)) return reader.read(key, lo, hi);
    if (cache->first != key) {
      std::vector<int64_t> full = shapes->at(param);
      full[static_cast<size_t>(split.dim)] *= split.parts;
      int64_t n = 1;
      for (int64_t d : full) n *= d;
      *cache = {key, vlm::tp_slice(reader.read(key, 0, n).view(full), split, rank, tp).view({-1})};
    }
    return cache->second.narrow(0, lo, hi - lo);
  };
  return StateReader(read, numel);
}

void ShardedModel::load_state(const StateReader& reader, int64_t optimizer_steps) {
  torch::NoGradGuard no_grad;
  const StateReader read = tp_ > 1 ? tensor_parallel_reader(reader) : reader;
  optimizer_->load_state(read, optimizer_steps);
  for (const auto& u : units_) {
    if (u.trainable() || !stores_frozen()) continue;
    torch::Tensor all;
    if (!read.numel || read.numel(u.path + "/param") == u.numel) {
      all = read(u.path + "/param", 0, u.numel);
    } else {  // written with another tp: parameter by parameter
      std::vector<torch::Tensor> parts;
      for (const auto& p : u.params) parts.push_back(read(p.name + "/param", 0, p.param.numel()).view({-1}));
      all = torch::cat(parts);
    }
    if (FsdpUnit* f = fsdp_ ? fsdp_->find_unit(u.path) : nullptr) {
      fsdp_->load_params(*f, all);
      continue;
    }
    int64_t off = 0;
    for (const auto& p : u.params) {
      torch::Tensor t = p.param.detach();
      t.view({-1}).copy_(all.narrow(0, off, t.numel()));
      off += t.numel();
    }
  }
}

namespace {
// Steps 0b-0e of apply_policies: the parallel dimensions that change the model. 0b expert
// parallelism (this rank's experts, read from `source` into *expert_load, and the dispatcher);
// 0c context parallelism (the attentions exchange over the cp group); 0d tensor parallelism
// (the decoder's activations over the tp group); 0e pipeline parallelism (this rank's stage,
// returned; the other stages' units are left on meta).
vlm::PipelineStage apply_model_dimensions(vlm::VisionLanguageModelImpl& model, const ShardingOptions& opts,
                                          ParallelDims& dims, vlm::ParamSource* source,
                                          std::shared_ptr<ExpertParallelDispatcher>* dispatcher,
                                          ShardedLoadStats* expert_load) {
  const bool ep_rules = std::any_of(opts.rules.begin(), opts.rules.end(), [](const PolicyRule& r) { return r.policy == "ep"; });
  VLM_CHECK(!ep_rules || dims.ep() > 1, "apply_policies: a sharding rule has policy = \"ep\" but dist.ep is ", dims.ep(),
            " (hint: set dist.ep to the ranks that split the experts, a divisor of the world size and of the experts "
            "per layer; or use ddp / fsdp for the experts)");
  VLM_CHECK(ep_rules || dims.ep() == 1, "apply_policies: dist.ep = ", dims.ep(), " but no sharding rule has policy = "
            "\"ep\" (hint: add [[sharding.module]] match = \"*.mlp.experts\", policy = \"ep\")");
  const ExpertLoad eload{source, dims.device(), opts.param_dtype, expert_load};
  if (ep_rules) *dispatcher = apply_expert_parallel(model, dims, source != nullptr ? &eload : nullptr);
  apply_context_parallel(model, dims, vlm::parse_sequence_mode(opts.cp_mode, "ShardingOptions::cp_mode"));
  VLM_CHECK(dims.tp() == 1 || !ep_rules, "apply_policies: dist.tp = ", dims.tp(),
            " with an ep rule: tensor and expert parallelism together are not built yet (hint: ddp / fsdp for the "
            "experts, which then run on each tp rank's chunk of the tokens)");
  apply_tensor_parallel(model, dims);
  VLM_CHECK(dims.pp() == 1 || (source != nullptr && !ep_rules), "apply_policies: dist.pp = ", dims.pp(),
            ep_rules ? " with an ep rule: pipeline and expert parallelism together are not built yet"
                     : " needs the model built on meta and a ParamSource (hint: model.sharded_load = true), so that "
                       "each stage materialises only its own units");
  return apply_pipeline_parallel(model, dims);
}
}  // namespace

std::unique_ptr<ShardedModel> apply_policies(vlm::VisionLanguageModelImpl& model, const ShardingOptions& opts,
                                             ParallelDims& dims, vlm::ParamSource* source) {
  std::unique_ptr<ShardedModel> sm(new ShardedModel());
  Comm& comm = dims.comm();
  sm->rank_ = comm.rank();
  sm->world_ = comm.world_size();
  sm->tp_ = dims.tp();
  sm->tp_rank_ = dims.tp_rank();
  sm->cfg_ = model.cfg;
  // 0. LoRA adapters on the Linear modules the lora rules select.
  attach_lora(model, opts);
  // 0b-0e. Expert, context, tensor and pipeline parallelism.
  ShardedLoadStats expert_load;
  const vlm::PipelineStage stage = apply_model_dimensions(model, opts, dims, source, &sm->dispatcher_, &expert_load);
  sm->stage_ = stage;
  // 1. Policy table (this stage's rows).
  sm->units_ = keep_stage_units(resolve_units(model, opts), stage);
  for (const auto& u : sm->units_)
    VLM_CHECK((u.sharding != Sharding::kHybridShard && u.sharding != Sharding::kFrozenHybrid) || dims.has_mesh(),
              "apply_policies: unit ", u.path,
              " is hybrid_shard (", u.rule, "), but ParallelDims has no mesh (hint: ParallelOptions::mesh = true, "
              "with dp_shard = the ranks per shard group; the trainer sets it from the recipe)");
  ShardedLoad loaded;
  if (source != nullptr) {  // 1b. sharded loading: real memory for what this rank keeps
    std::vector<UnitPlan> rest;  // the experts rows were read in step 0b
    for (const auto& u : sm->units_)
      if (u.sharding != Sharding::kExpert) rest.push_back(u);
    loaded = materialize_units(model, rest, sm->rank_, sm->world_, dims.device(), opts.param_dtype, *source,
                               dims.shard_rank(), dims.dp_shard());
    sm->load_stats_ = loaded.stats;
    sm->load_stats_.elements_filled += expert_load.elements_filled;
    sm->load_stats_.whole_units += expert_load.whole_units;
    sm->load_stats_.bytes_read += expert_load.bytes_read;
    sm->units_ = resolve_units(model, opts);  // the new parameter handles
    if (!stage.whole()) sm->layout_units_ = sm->units_;
    sm->units_ = keep_stage_units(sm->units_, stage);
  }
  for (const auto& u : sm->units_)
    if (!u.adapter_of.empty()) sm->stores_frozen_ = false;
  for (const auto& u : sm->units_)
    for (const auto& p : u.params) {
      VLM_CHECK(p.param.scalar_type() == opts.param_dtype, "apply_policies: parameter ", p.name, " is ",
                p.param.scalar_type(), " but precision.param_dtype is ", c10::toString(opts.param_dtype),
                " (hint: build or materialise the model in the recipe's param_dtype before sharding)");
      VLM_CHECK(p.param.device() == dims.device(), "apply_policies: parameter ", p.name, " is on ",
                p.param.device(), " but this rank computes on ", dims.device(),
                " (hint: materialise the model on ParallelDims::device())");
    }
  // 2. Freeze.
  apply_freeze(sm->units_);
  // 3. Same starting point on every rank (sharded loading: by construction, every rank read
  //    its ranges from the same source).
  //    Experts: from the first rank holding the same ones (the expert-replicate group).
  if (source == nullptr) {
    std::vector<torch::Tensor> all, experts;
    for (const auto& u : sm->units_)
      for (const auto& p : u.params) (u.sharding == Sharding::kExpert ? experts : all).push_back(p.param.detach());
    broadcast_from_rank0(comm, all, "broadcast parameters from rank 0");
    if (!experts.empty())
      broadcast_from_rank0(dims.expert_replicate_comm(), experts, "broadcast experts within the expert-replicate group");
  }
  // 4. FSDP units (flat buffers, local shards, gradient hooks).
  std::vector<std::pair<std::string, std::string>> call_order;
  for (const auto& u : model.units())
    if (stage.runs(u.path)) call_order.emplace_back(u.path, u.shares_params_with.empty() ? u.path : u.shares_params_with);
  const HybridComms hybrid{&dims.shard_comm(Lane::kGather), &dims.shard_comm(Lane::kReduce), &dims.replicate_comm()};
  auto fsdp = std::make_unique<FsdpEngine>(dims.comm(Lane::kGather), dims.comm(Lane::kReduce), sm->units_, call_order,
                                           opts.reduce_dtype, std::move(loaded.shards), hybrid);
  fsdp->set_accumulate_unsharded(opts.fsdp_accumulate_unsharded);
  fsdp->skip_backward_gather(calls_without_backward_gather(model, sm->units_));
  if (!fsdp->units().empty()) sm->fsdp_ = std::move(fsdp);
  // 5. DDP buckets over the trainable replicated / ZeRO-1 units (forward registration order).
  std::vector<torch::Tensor> params, expert_params;
  std::vector<std::string> names, expert_names;
  for (const auto& u : sm->units_) {
    const bool expert = u.sharding == Sharding::kExpert;
    if (!expert && !(u.trainable() && (u.sharding == Sharding::kReplicated || u.sharding == Sharding::kShardOptimizer)))
      continue;
    for (const auto& p : u.params) {
      (expert ? expert_params : params).push_back(p.param);
      (expert ? expert_names : names).push_back(p.name);
    }
  }
  const double bucket_bytes = opts.ddp_bucket_mb * 1024.0 * 1024.0;
  if (!params.empty())
    sm->reducer_ = std::make_unique<DdpReducer>(dims.comm(Lane::kDdp), params, names, bucket_bytes, opts.reduce_dtype);
  if (!expert_params.empty())
    sm->expert_reducer_ = std::make_unique<DdpReducer>(dims.expert_replicate_comm(), expert_params, expert_names,
                                                       bucket_bytes, opts.reduce_dtype);
  // 6. Runner.
  sm->runner_ = std::make_shared<PolicyRunner>(sm->units_, sm->fsdp_.get());
  model.set_runner(sm->runner_);
  // 7. Optimizer.
  sm->optimizer_ = std::make_unique<ShardedAdamW>(comm, sm->units_, opts.optim, sm->fsdp_.get(), &dims.control(),
                                                  opts.optimizer_offload, &dims.expert_replicate_comm());
  if (dims.tp() > 1)
    sm->optimizer_->set_tensor_parallel(&dims.tp_comm(), [cfg = model.cfg, tp = dims.tp()](const std::string& name) {
      return tensor_parallel_sharing(cfg, name, tp);
    });
  if (dims.pp() > 1) {  // a tied head: the embedding's gradient summed between stage 0 and the last
    sm->optimizer_->set_pipeline(dims.pp_rank(), dims.pp());
    if (model.cfg.tie_word_embeddings)
      sm->optimizer_->add_shared_gradients(&dims.pp_tie(), [](const std::string& name) {
        return name == "model.embed_tokens.weight" ? int64_t{1} : int64_t{0};
      }, "tied embedding gradient sum (pipeline)");
  }
  sm->optimizer_->attach_ddp(sm->reducer_.get());
  sm->optimizer_->attach_ddp(sm->expert_reducer_.get());
  if (opts.optimizer_offload) {  // offload.h: each read of parameters waits for its update
    ShardedAdamW* opt = sm->optimizer_.get();
    sm->runner_->set_before_call([opt] { opt->wait_unsharded(); });
    if (sm->fsdp_) sm->fsdp_->set_before_gather([opt](FsdpUnit& u) { opt->wait_unit(u); });
  }
  return sm;
}

std::set<std::string> calls_without_backward_gather(vlm::VisionLanguageModelImpl& model,
                                                    const std::vector<UnitPlan>& units) {
  std::set<std::string> out;
  for (const auto& call : model.units()) {
    if (call.backward_reads_params || !model.pipeline_stage().runs(call.path)) continue;
    const std::string& owner = call.shares_params_with.empty() ? call.path : call.shares_params_with;
    const auto it = std::find_if(units.begin(), units.end(), [&](const UnitPlan& u) { return u.path == owner; });
    if (it != units.end() && !it->checkpointed) out.insert(call.path);
  }
  return out;
}

}  // namespace vlm::sharding
