// materialize_units (see sharded_load.h).
#include "sharding/parallel/sharded_load.h"

#include <algorithm>

#include "sharding/parallel/flat_buffer.h"
#include "vlm/runtime/check.h"

namespace vlm::sharding {
namespace {

std::string not_adopted_message(const std::string& unit) {
  return str("sharded load: unit ", unit, "'s parameters are slices of a gather buffer that has no memory until "
             "the FSDP engine gathers it (hint: read the rank's local shard, or run the unit through its runner)");
}

}  // namespace

bool shards_params(Sharding s) {
  return s == Sharding::kFullShard || s == Sharding::kShardGradOp || s == Sharding::kHybridShard ||
         s == Sharding::kFrozenSharded || s == Sharding::kFrozenHybrid;
}

ShardedLoad materialize_units(torch::nn::Module& model, const std::vector<UnitPlan>& units, int64_t world_rank,
                              int64_t world_size, torch::Device device, torch::Dtype dtype, vlm::ParamSource& source,
                              int64_t hybrid_rank, int64_t hybrid_size) {
  torch::NoGradGuard no_grad;
  vlm::ParamReplacer replacer(model);
  const auto topts = torch::TensorOptions().device(device).dtype(dtype);
  const uint64_t read_before = source.bytes_read();
  ShardedLoad out;
  ShardedLoadStats& st = out.stats;
  for (const auto& u : units) {
    for (const auto& p : u.params)
      VLM_CHECK(p.param.is_meta(), "sharded load: parameter ", p.name, " of unit ", u.path, " is already on ",
                p.param.device(), " (hint: sharded loading starts from a model built on the meta device)");
    if (!shards_params(u.sharding)) {  // every rank keeps the whole unit
      for (const auto& p : u.params) {
        torch::Tensor v = torch::empty(p.param.sizes(), topts);
        source.fill(p.name, 0, v.numel(), v.view({-1}));
        st.elements_filled += v.numel();
        replacer.replace(p.name, v);
      }
      ++st.whole_units;
      source.drop_resident_pages();
      continue;
    }
    const bool hybrid =
        (u.sharding == Sharding::kHybridShard || u.sharding == Sharding::kFrozenHybrid) && hybrid_size > 0;
    const int64_t rank = hybrid ? hybrid_rank : world_rank, world = hybrid ? hybrid_size : world_size;
    int64_t numel = 0;
    for (const auto& p : u.params) numel += p.param.numel();
    const int64_t shard = (numel + world - 1) / world;
    const int64_t lo = std::min(rank * shard, numel), hi = std::min((rank + 1) * shard, numel);
    // [N*S]: the gather buffer, laid out but given no memory (the FSDP engine fills it per gather)
    torch::Tensor flat = unallocated_flat(world * shard, topts, not_adopted_message(u.path));
    torch::Tensor local = torch::empty({shard}, topts);         // [S]: elements [lo, hi) + zero padding
    int64_t off = 0;
    for (const auto& p : u.params) {
      const int64_t n = p.param.numel();
      const int64_t a = std::max(lo, off), b = std::min(hi, off + n);
      if (a < b) {
        source.fill(p.name, a - off, b - off, local.narrow(0, a - lo, b - a));
        st.elements_filled += b - a;
      }
      replacer.replace(p.name, slice_of(flat, off, p.param.sizes()));
      off += n;
    }
    if (hi - lo < shard) local.narrow(0, hi - lo, shard - (hi - lo)).zero_();  // padding
    out.shards.emplace(u.path, local);
    ++st.sharded_units;
    source.drop_resident_pages();  // the checkpoint pages read for this unit leave the RSS
  }
  st.bytes_read = source.bytes_read() - read_before;
  return out;
}

bool params_are_flat_slices(const std::vector<UnitParam>& params, int64_t flat_numel) {
  if (params.empty() || params.front().param.is_meta()) return false;
  const torch::Tensor& p0 = params.front().param;
  const c10::StorageImpl* storage = p0.storage().unsafeGetStorageImpl();
  if (!is_released(storage) && p0.storage().nbytes() != static_cast<size_t>(flat_numel) * p0.element_size())
    return false;
  int64_t off = 0;
  for (const auto& p : params) {
    const torch::Tensor& t = p.param;
    if (t.storage().unsafeGetStorageImpl() != storage || t.storage_offset() != off || !t.is_contiguous())
      return false;
    off += t.numel();
  }
  return off <= flat_numel;
}

}  // namespace vlm::sharding
