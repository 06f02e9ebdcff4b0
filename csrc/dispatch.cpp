// CallContext: CPU aliases of neuron tensors for one op call, and the way back.
#include "dispatch.h"

#include <c10/core/CPUAllocator.h>

namespace neuron {
namespace {

// The alias storage's DataPtr holds a reference on the neuron storage, so the
// bytes outlive the alias even if a kernel (or Gloo's async work) keeps it.
void release_storage_ref(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

const char* layout_problem(const at::Tensor& t) {
  if (t.is_sparse() || t.is_sparse_csr()) return "sparse";
  if (t.is_quantized()) return "quantized";
  if (t.is_nested()) return "nested";
  if (t.is_mkldnn()) return "mkldnn";
  if (t.layout() != c10::kStrided) return "non-strided";
  return nullptr;
}

}  // namespace

c10::DataPtr host_alias_data(c10::StorageImpl* neuron_storage) {
  c10::raw::intrusive_ptr::incref(neuron_storage);
  return c10::DataPtr(neuron_storage->mutable_data(), neuron_storage, &release_storage_ref,
                      c10::Device(c10::DeviceType::CPU));
}

c10::StorageImpl* aliased_neuron_storage(const c10::Storage& cpu_storage) {
  const c10::DataPtr& data = cpu_storage.data_ptr();
  if (data.get_deleter() != &release_storage_ref) return nullptr;
  auto* neuron_storage = static_cast<c10::StorageImpl*>(data.get_context());
  // Still over the same bytes (an out= kernel may have grown the alias into new memory).
  return neuron_storage->data() == data.get() ? neuron_storage : nullptr;
}

at::Tensor make_neuron_tensor(c10::Storage storage, const at::Tensor& like) {
  c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  if (like._is_zerotensor()) keys = keys.add(c10::DispatchKey::ZeroTensor);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) t._set_conj(true);
  if (like.is_neg()) t._set_neg(true);
  return t;
}

c10::Storage CallContext::alias_storage(const c10::Storage& s) {
  auto* impl = s.unsafeGetStorageImpl();
  for (const auto& p : storages_) {
    if (p.neuron == impl) return p.alias;
  }
  c10::DataPtr data = host_alias_data(impl);
  // Resizable with the CPU allocator: an out= kernel may grow it (see sync_mutated).
  c10::Storage alias(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->nbytes(), std::move(data), c10::GetCPUAllocator(),
      /*resizable=*/true));
  storages_.push_back({impl, alias});
  return alias;
}

at::Tensor CallContext::alias(const at::Tensor& t, bool cpu_ok) {
  if (!t.defined()) return t;
  if (C10_UNLIKELY(op_tracking_level() >= 2) && observe_arguments_) observed_inputs_.push_back(t);
  const auto type = t.device().type();
  if (type != kNeuron) {
    if (!cpu_ok && t.dim() > 0 && type == c10::DeviceType::CPU) saw_cpu_tensor_ = true;
    return t;
  }
  const auto index = t.device().index();
  if (device_ < 0) {
    device_ = index;
  } else if (index != device_) {
    other_neuron_device_ = index;
  }
  auto* impl = t.unsafeGetTensorImpl();
  for (const auto& p : tensors_) {
    if (p.original.unsafeGetTensorImpl() == impl) return p.alias;
  }
  c10::DispatchKeySet keys(c10::DispatchKey::CPU);
  if (t._is_zerotensor()) keys = keys.add(c10::DispatchKey::ZeroTensor);
  auto a = at::detail::make_tensor<c10::TensorImpl>(alias_storage(t.storage()), keys, t.dtype());
  a.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) a._set_conj(true);
  if (t.is_neg()) a._set_neg(true);
  tensors_.push_back({t, a});
  return a;
}

void CallContext::check_devices() const {
  if (device_ < 0) return;
  TORCH_CHECK(other_neuron_device_ < 0,
              "Expected all tensors to be on the same device, but found at least two devices, neuron:",
              int(device_), " and neuron:", int(other_neuron_device_), "! (in ", op_name_, ")");
  // TorchNeuron's words (python_ops/base.py, can_handle), then torch's and the fix.
  TORCH_CHECK(!saw_cpu_tensor_, "Non-scalar tensor argument of ", op_name_,
              " is on cpu device, expected neuron: all tensors must be on the same device, found neuron:",
              int(device_), " and cpu. Move the cpu tensor with .to('neuron'), or pass a 0-dim tensor or a "
              "Python scalar.");
}

c10::Storage CallContext::neuron_storage_for(const c10::Storage& cpu_storage) {
  auto* impl = cpu_storage.unsafeGetStorageImpl();
  for (const auto& p : storages_) {
    if (p.alias.unsafeGetStorageImpl() == impl) {
      return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(p.neuron));
    }
  }
  for (const auto& p : adopted_) {
    if (p.cpu == impl) return p.neuron;
  }
  // The alias of an earlier call (a host route's input, a DLPack export): its bytes are that
  // neuron storage's, not memory to adopt and count a second time.
  if (c10::StorageImpl* neuron_storage = aliased_neuron_storage(cpu_storage)) {
    return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(neuron_storage));
  }
  count_allocation();
  c10::Storage adopted(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), cpu_storage.nbytes(), adopt_storage(cpu_storage, output_device()),
      neuron_allocator(), /*resizable=*/true));
  adopted_.push_back({impl, adopted});
  return adopted;
}

at::Tensor CallContext::to_neuron_impl(const at::Tensor& r) {
  if (!r.defined() || r.device().type() != c10::DeviceType::CPU) return r;
  auto* impl = r.unsafeGetTensorImpl();
  for (const auto& p : tensors_) {
    if (p.alias.unsafeGetTensorImpl() == impl) return p.original;
  }
  if (const char* problem = layout_problem(r)) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, op_name_, " produced a ", problem, " (", r.layout(),
                                ") tensor: ", problem,
                                " tensors are not supported on neuron. Keep this computation on the CPU "
                                "(e.g. x.cpu()), or use a dense strided tensor.");
  }
  if (r.use_count() == 1 && r.storage().use_count() == 1 && !r.is_view()) return retag_fresh_result(r);
  return make_neuron_tensor(neuron_storage_for(r.storage()), r);
}

at::Tensor CallContext::retag_fresh_result(const at::Tensor& r) {
  // Nothing else holds this result or its storage (so it is no alias storage,
  // which storages_ holds too): it becomes the neuron tensor itself, memory
  // adopted in place and backend keys switched, with no new objects.
  count_allocation();
  auto* impl = r.unsafeGetTensorImpl();
  auto* storage = impl->storage().unsafeGetStorageImpl();
  const auto index = output_device();
  const size_t nbytes = storage->nbytes();
  c10::DataPtr cpu_data = storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
  storage->set_data_ptr_noswap(adopt_data_ptr(std::move(cpu_data), nbytes, index));
  storage->set_allocator(neuron_allocator());
  impl->set_storage_keep_dtype(impl->storage());  // refreshes the tensor's device from its storage
  impl->_change_backend_component_keys(c10::Device(kNeuron, index));
  return r;
}

void CallContext::sync_mutated() {
  // A kernel that grew an out= argument reallocated its alias storage with the
  // CPU allocator: the neuron storage takes over that memory.
  for (const auto& p : storages_) {
    auto* alias = p.alias.unsafeGetStorageImpl();
    auto* orig = p.neuron;
    if (alias->data_ptr().get() == orig->data_ptr().get() && alias->nbytes() == orig->nbytes()) continue;
    const size_t nbytes = alias->nbytes();
    c10::DataPtr moved = alias->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
    void* data = moved.get();
    orig->set_data_ptr_noswap(adopt_data_ptr(std::move(moved), nbytes, orig->device().index()));
    orig->set_nbytes(nbytes);
    // Later results of this call that view the alias storage still find the bytes.
    alias->set_data_ptr_noswap(c10::DataPtr(data, c10::Device(c10::DeviceType::CPU)));
    alias->set_nbytes(nbytes);
  }
  for (auto& p : tensors_) {
    auto* alias = p.alias.unsafeGetTensorImpl();
    auto* orig = p.original.unsafeGetTensorImpl();
    // set_() swapped the storage: point the neuron tensor at the matching neuron storage.
    auto* alias_storage = alias->storage().unsafeGetStorageImpl();
    c10::StorageImpl* expected = nullptr;
    for (const auto& s : storages_) {
      if (s.neuron == orig->storage().unsafeGetStorageImpl()) expected = s.alias.unsafeGetStorageImpl();
    }
    if (alias_storage != expected) orig->set_storage_keep_dtype(neuron_storage_for(alias->storage()));
    if (alias->sizes() != orig->sizes() || alias->strides() != orig->strides() ||
        alias->storage_offset() != orig->storage_offset()) {
      orig->set_sizes_and_strides(alias->sizes(), alias->strides(), alias->storage_offset());
    }
  }
}

}  // namespace neuron
