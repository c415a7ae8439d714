// Flat buffers with memory that comes and goes (see flat_buffer.h).
#include "sharding/parallel/flat_buffer.h"

#include "vlm/runtime/check.h"

namespace vlm::sharding {
namespace {

// A released StorageImpl is told to throw on any data access with the buffer's message
// (release_data_and_set_meta_custom_data_ptr_error_msg_, LibTorch's own mechanism for
// storages without data, as torch.export's fake tensors use). LibTorch has no call that
// lifts it again, so refill_storage clears the flag through an explicit template
// instantiation, where C++ does not check access ([temp.spec.general]/6). A LibTorch that
// renames the member fails to compile here instead of misbehaving; fsdp_dist_test covers
// release -> read error -> re-gather -> read.
template <typename Tag, typename Tag::type Member>
struct ExposeMember {
  friend typename Tag::type member_of(Tag) { return Member; }
};
struct ThrowOnReadFlag {
  using type = bool c10::StorageImpl::*;
  friend type member_of(ThrowOnReadFlag);
};
template struct ExposeMember<ThrowOnReadFlag, &c10::StorageImpl::throw_on_immutable_data_ptr_>;

// A tensor of `sizes` / `strides` over `impl` from element `offset`, set on the TensorImpl
// directly: Tensor::set_ checks the bounds against nbytes, which is 0 while released.
torch::Tensor over_storage(const c10::Storage& storage, const torch::TensorOptions& options, int64_t offset,
                           torch::IntArrayRef sizes, torch::IntArrayRef strides) {
  torch::Tensor t = torch::empty({0}, options);
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(storage);
  impl->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

}  // namespace

torch::Tensor unallocated_flat(int64_t numel, const torch::TensorOptions& options, const std::string& msg) {
  const c10::Device device = options.device();
  c10::Allocator* allocator = c10::GetAllocator(device.type());
  VLM_CHECK(allocator != nullptr, "flat buffer: no allocator for ", device);
  auto impl = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), size_t{0},
                                                    c10::DataPtr(nullptr, device), allocator, /*resizable=*/true);
  impl->release_data_and_set_meta_custom_data_ptr_error_msg_(msg);
  return over_storage(c10::Storage(std::move(impl)), options.requires_grad(false), 0, {numel}, {1});
}

torch::Tensor slice_of(const torch::Tensor& flat, int64_t offset, torch::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * sizes[d + 1];
  return over_storage(flat.storage(), flat.options().requires_grad(false), flat.storage_offset() + offset, sizes,
                      strides);
}

torch::Tensor whole_of(const torch::Tensor& like, int64_t numel) {
  return over_storage(like.storage(), like.options().requires_grad(false), 0, {numel}, {1});
}

void release_storage(c10::StorageImpl* impl, c10::Device device, const std::string& msg) {
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, device));
  impl->set_nbytes(0);
  impl->release_data_and_set_meta_custom_data_ptr_error_msg_(msg);
}

void refill_storage(c10::StorageImpl* impl, size_t nbytes) {
  impl->*member_of(ThrowOnReadFlag{}) = false;
  impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));  // also recomputes the data-ptr checks
  impl->set_nbytes(nbytes);
}

bool is_released(const c10::StorageImpl* impl) {
  return impl->nbytes() == 0 && impl->*member_of(ThrowOnReadFlag{});
}

}  // namespace vlm::sharding
