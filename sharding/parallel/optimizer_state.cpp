// ShardedAdamW's checkpoint state (see optimizer.h): the slices each rank writes and the
// loading of a checkpoint's vectors, also one written with the units split another way.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "sharding/parallel/fsdp.h"
#include "sharding/parallel/optimizer.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {

std::vector<StateSlice> ShardedAdamW::state_slices() const {
  torch::NoGradGuard no_grad;
  wait();
  std::vector<StateSlice> out;
  // State on a GPU is copied into pinned host memory without blocking, then waited once at
  // the end (the save's one host sync) instead of one pageable, blocking copy per segment.
  int cuda_index = -1;
  for (const auto& g : groups_)
    for (const auto& s : g.segments)
      if (s.master.is_cuda()) cuda_index = s.master.get_device();
  const auto host = torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(cuda_index >= 0);
  const bool async = cuda_index >= 0;
  for (const auto& g : groups_) {
    if (g.experts) expert_slices(g, host, async, out);
    // Every rank holds state for at least [lo, hi) (replicated: all of [0, P)) and writes
    // [own_lo, own_hi): R_r, or under hybrid_shard its replica's share of it, so the ranks'
    // slices cover each vector once.
    const int64_t lo = g.experts ? 0 : g.own_lo, hi = g.experts ? 0 : g.own_hi;  // experts: per parameter
    StateSlice master{g.path + "/master", g.numel, lo, hi, torch::empty({hi - lo}, host)};
    StateSlice m{g.path + "/exp_avg", g.numel, lo, hi, torch::empty({hi - lo}, host)};
    StateSlice v{g.path + "/exp_avg_sq", g.numel, lo, hi, torch::empty({hi - lo}, host)};
    int64_t covered = 0;
    for (const auto& s : g.segments) {
      const int64_t a = std::max(lo, s.flat_offset), b = std::min(hi, s.flat_offset + s.len);
      if (a >= b) continue;
      master.data.narrow(0, a - lo, b - a).copy_(s.master.narrow(0, a - s.flat_offset, b - a), async);
      m.data.narrow(0, a - lo, b - a).copy_(s.m.narrow(0, a - s.flat_offset, b - a), async);
      v.data.narrow(0, a - lo, b - a).copy_(s.v.narrow(0, a - s.flat_offset, b - a), async);
      covered += b - a;
    }
    VLM_CHECK(covered == hi - lo, "optimizer state of unit ", g.path, ": segments cover ", covered,
              " of the written range's ", hi - lo, " elements (internal error)");
    if (!g.experts) {
      out.push_back(std::move(master));
      out.push_back(std::move(m));
      out.push_back(std::move(v));
    }
    // Step counts are the same on every rank; each writes its owned_range of them.
    const int64_t np = static_cast<int64_t>(g.params.size());
    const auto [slo, shi] = owned_range(np, comm_.world_size(), comm_.rank());
    torch::Tensor steps = torch::tensor(g.param_steps, torch::kInt64).narrow(0, slo, shi - slo).clone();
    out.push_back({g.path + "/step", np, slo, shi, steps});
  }
  if (async) torch::cuda::synchronize(cuda_index);  // the copies are done before anyone reads them
  return out;
}

namespace {
bool no_state_named(const Error& e) { return std::string(e.what()).find("no state named") != std::string::npos; }

// Does the checkpoint hold unit vector `key` with `numel` elements, as this model's unit? A
// reader that cannot say is taken to hold the same layout.
bool same_layout(const StateReader& read, const std::string& key, int64_t numel) {
  return !read.numel || read.numel(key) == numel;
}

// Elements [lo, hi) of a group's flat `kind` vector, parameter by parameter ("<param>/<kind>"):
// the checkpoint split the unit another way (expert parallelism on or off).
torch::Tensor read_by_param(const StateReader& read, const std::vector<UnitParam>& params,
                            const std::vector<int64_t>& offsets, const std::string& kind, int64_t lo, int64_t hi) {
  torch::Tensor out = torch::empty({hi - lo}, torch::kFloat32);
  for (size_t k = 0; k < params.size(); ++k) {
    const int64_t off = offsets[k], n = params[k].param.numel();
    const int64_t a = std::max(lo, off), b = std::min(hi, off + n);
    if (a >= b) continue;
    const int64_t src = params[k].source_offset;  // ep experts: where the held ones start in all E
    out.narrow(0, a - lo, b - a).copy_(read(params[k].name + "/" + kind, src + a - off, src + b - off));
  }
  return out;
}

// "<unit>/step" [np] from a checkpoint, or np x `fallback` when it has none (written before
// per-parameter step counts; CheckpointReader says "no state named ..." then). A checkpoint
// that split the unit another way: each parameter's "<param>/step" [1].
std::vector<int64_t> read_param_steps(const StateReader& read, const std::string& unit,
                                      const std::vector<UnitParam>& params, int64_t fallback) {
  const auto np = static_cast<int64_t>(params.size());
  torch::Tensor t;
  try {
    const bool by_param = read.numel && read.numel(unit + "/step") != np && np > 0 &&
                          read.numel(params[0].name + "/step") == 1;
    if (!by_param) {
      t = read(unit + "/step", 0, np);
    } else {
      t = torch::empty({np}, torch::kFloat64);
      for (int64_t k = 0; k < np; ++k) t[k] = read(params[k].name + "/step", 0, 1).to(torch::kFloat64)[0];
    }
  } catch (const Error& e) {
    if (!no_state_named(e)) throw;
    return std::vector<int64_t>(static_cast<size_t>(np), fallback);
  }
  VLM_CHECK(t.numel() == np, "checkpoint: ", unit, "/step has ", t.numel(), " elements, expected ", np,
            " (one per parameter of the unit)");
  t = t.to(torch::kFloat64).round().to(torch::kInt64).contiguous();  // readers may hand back floats
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + np);
}
}  // namespace

void ShardedAdamW::load_state(const StateReader& read, int64_t steps) {
  torch::NoGradGuard no_grad;
  wait();
  for (auto& g : groups_) {
    if (g.experts) {
      load_experts(g, read);
      g.param_steps = read_param_steps(read, g.path, g.params, steps);
      continue;
    }
    // The checkpoint's unit vector, or (written with the unit split another way) its
    // parameters one by one.
    const bool whole = same_layout(read, g.path + "/master", g.numel);
    auto vec = [&](const char* kind, int64_t lo, int64_t hi) {
      return whole ? read(g.path + "/" + kind, lo, hi) : read_by_param(read, g.params, g.offsets, kind, lo, hi);
    };
    // Parameters: every element, from the fp32 masters.
    torch::Tensor all = vec("master", 0, g.numel).to(torch::kFloat32);
    VLM_CHECK(all.numel() == g.numel, "checkpoint: ", g.path, "/master has ", all.numel(), " elements, expected ",
              g.numel);
    if (g.fsdp != nullptr) {
      fsdp_->load_params(*g.fsdp, all);  // local shard only; the parameters are gathered on use
    } else {
      for (size_t k = 0; k < g.params.size(); ++k) {
        torch::Tensor p = g.params[k].param.detach();
        p.view({-1}).copy_(all.narrow(0, g.offsets[k], p.numel()));
      }
    }
    for (auto& s : g.segments) {
      s.master.copy_(all.narrow(0, s.flat_offset, s.len));  // a no-op copy onto itself for fp32 views
      s.m.copy_(vec("exp_avg", s.flat_offset, s.flat_offset + s.len));
      s.v.copy_(vec("exp_avg_sq", s.flat_offset, s.flat_offset + s.len));
    }
    g.param_steps = read_param_steps(read, g.path, g.params, steps);
  }
  step_ = steps;
  agreed_ = false;
}

// Expert rows: per parameter, this rank's segments (its R_r within the expert-replicate
// group) placed in the held run [source_offset, source_offset + numel) of all E experts.
void ShardedAdamW::expert_slices(const Group& g, const torch::TensorOptions& host, bool async,
                                 std::vector<StateSlice>& out) const {
  for (const auto& s : g.segments) {
    const UnitParam& up = g.params[s.param];
    const int64_t full = up.source_numel > 0 ? up.source_numel : up.param.numel();
    const int64_t lo = up.source_offset + s.param_offset;
    for (const auto& [kind, t] : {std::pair<const char*, torch::Tensor>{"master", s.master}, {"exp_avg", s.m},
                                  {"exp_avg_sq", s.v}}) {
      StateSlice sl{up.name + "/" + kind, full, lo, lo + s.len, torch::empty({s.len}, host)};
      sl.data.copy_(t, async);
      out.push_back(std::move(sl));
    }
  }
}

void ShardedAdamW::load_experts(Group& g, const StateReader& read) {
  for (const auto& up : g.params) {  // every held element (replicas keep whole parameters)
    const torch::Tensor all = read(up.name + "/master", up.source_offset, up.source_offset + up.param.numel());
    up.param.detach().view({-1}).copy_(all.to(torch::kFloat32));
  }
  for (auto& s : g.segments) {  // the state of this rank's R_r
    const UnitParam& up = g.params[s.param];
    const int64_t lo = up.source_offset + s.param_offset, hi = lo + s.len;
    s.master.copy_(read(up.name + "/master", lo, hi));  // a no-op copy onto itself for fp32 views
    s.m.copy_(read(up.name + "/exp_avg", lo, hi));
    s.v.copy_(read(up.name + "/exp_avg_sq", lo, hi));
  }
}

}  // namespace vlm::sharding
