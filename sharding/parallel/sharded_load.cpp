// materialize_units (see sharded_load.h).
#include "sharding/parallel/sharded_load.h"

#include <algorithm>

#include "vlm/runtime/check.h"

namespace vlm::sharding {
namespace {

// A tensor of `sizes` (contiguous) over `storage` from element `offset`: shares the memory
// without being an autograd view of the flat buffer (what Tensor::set_data gives FSDP's
// parameters; an autograd view would make in-place optimizer updates of a leaf an error).
torch::Tensor slice_of(const torch::Tensor& flat, int64_t offset, torch::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * sizes[d + 1];
  torch::Tensor t = torch::empty({0}, flat.options());
  t.set_(flat.storage(), flat.storage_offset() + offset, sizes, strides);
  return t;
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
    torch::Tensor flat = torch::empty({world * shard}, topts);  // [N*S]: the gather buffer, not written here
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
  if (p0.storage().nbytes() != static_cast<size_t>(flat_numel) * p0.element_size()) return false;
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
