// Flat buffers whose memory comes and goes while the tensors over them stay: FSDP's gather
// buffer [N*S] (fsdp.h) and sharded loading's layout of a unit's parameters as its slices
// (sharded_load.h). A buffer is either released (its StorageImpl holds no memory, nbytes 0,
// and any data access throws the buffer's message) or filled (fresh memory of the full
// size from the storage's own allocator: the CUDA caching allocator on a GPU). Parameters
// and autograd's saved views keep pointing at the StorageImpl through both states, which
// is how FSDP frees a unit between uses without touching the module (FSDP2 does the same
// with untyped_storage().resize_()).
//
//   torch::Tensor flat = unallocated_flat(n, opts, "unit x is released");  // [n], no memory
//   ... parameters set_() as slices of flat ...
//   refill_storage(flat.storage().unsafeGetStorageImpl(), n * itemsize);   // memory again
//   release_storage(flat.storage().unsafeGetStorageImpl(), flat.device(), msg);
#pragma once
#include <torch/torch.h>

#include <string>

namespace vlm::sharding {

// A 1-D tensor of `numel` elements over a storage that never received memory: released from
// the start (reads throw `msg`). Its size can be used to lay out slices (slice_of) before the
// first fill. Allocates nothing on any device.
torch::Tensor unallocated_flat(int64_t numel, const torch::TensorOptions& options, const std::string& msg);

// A tensor of `sizes` (contiguous) over `flat`'s storage from element `offset`: shares the
// StorageImpl without being an autograd view of `flat` (as Tensor::set_data gives FSDP's
// parameters; an autograd view would make in-place optimizer updates of a leaf an error).
// Works on released storages (no bounds or data check).
torch::Tensor slice_of(const torch::Tensor& flat, int64_t offset, torch::IntArrayRef sizes);

// A 1-D tensor [numel] over the StorageImpl `like` lies in (released or filled).
torch::Tensor whole_of(const torch::Tensor& like, int64_t numel);

// Frees the storage's memory and makes every later data access throw `msg`.
void release_storage(c10::StorageImpl* impl, c10::Device device, const std::string& msg);
// Lifts release_storage's error and gives the storage `nbytes` of fresh memory (contents
// undefined).
void refill_storage(c10::StorageImpl* impl, size_t nbytes);
// Whether the storage is released (holds no memory and throws on access).
bool is_released(const c10::StorageImpl* impl);

}  // namespace vlm::sharding
