// The few ops neuron implements itself: memory (empty, resize_), metadata-only
// views, copies across devices, scalars, and the ops whose CPU kernel is not
// reachable by redispatch (convolution_overrideable, the SDPA backend choice).
#include "dispatch.h"

#include <ATen/EmptyTensor.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

namespace neuron {
namespace {

void check_strided(std::optional<c10::Layout> layout, const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(!layout.has_value() || *layout == c10::kStrided, op, ": layout ", *layout,
                              " is not supported on neuron; only torch.strided tensors are.");
}

c10::DeviceIndex target_index(std::optional<c10::Device> device) {
  return resolve_device_index(device.has_value() ? device->index() : -1);
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool>, std::optional<c10::MemoryFormat> memory_format) {
  check_strided(layout, "empty");
  CallContext ctx("aten::empty.memory_format");  // tracked, as TorchNeuron's allocation ops are
  DeviceScope scope(target_index(device));
  count_allocation();
  return at::detail::empty_generic(size, neuron_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool>) {
  check_strided(layout, "empty_strided");
  CallContext ctx("aten::empty_strided");
  DeviceScope scope(target_index(device));
  count_allocation();  // also when a named op (clone) calls it, which counts only its own name
  return at::detail::empty_strided_generic(size, stride, neuron_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// copy_ between any mix of neuron and CPU tensors: a CPU copy between aliases
// (dtype conversion, broadcasting and conj/neg bits are CPU's own).
at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  CallContext ctx("aten::copy_");
  auto dst = ctx.alias(self, /*cpu_ok=*/true);
  auto from = ctx.alias(src, /*cpu_ok=*/true);
  dst.copy_(from, non_blocking);
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor out = dst;
  copy_(out, self, non_blocking);
  return dst;
}

// TorchNeuron's rules: CPU to neuron only, and a resize only of an empty dst.
at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  TORCH_CHECK(self.is_cpu() && dst.device().type() == kNeuron,
              "_copy_from_and_resize now only support copy from cpu tensor to neuron tensor, but got src tensor "
              "device is ", self.device(), " and dst device is ", dst.device(),
              ". To copy between any two devices, use dst.copy_(src).");
  if (dst.numel() == 0) dst.resize_(self.sizes());
  TORCH_CHECK(self.sizes() == dst.sizes(),
              "_copy_from_and_resize now only support copy with same size, or dst.numel() == 0! Got src of size ",
              self.sizes(), " and dst of size ", dst.sizes(), "; pass an empty dst to have it resized.");
  return copy_from(self, dst, false);
}

// TorchNeuron's torch-mlir _to_copy kernel takes neuron -> neuron copies but for float64, bool and
// int32, which, like every copy across devices, run PyTorch's native _to_copy: empty, then copy_
// (its op tracking lists both).
bool copies_through_copy_(const at::Tensor& self, bool to_neuron, std::optional<c10::ScalarType> dtype) {
  const auto special = [](c10::ScalarType t) { return t == c10::kDouble || t == c10::kBool || t == c10::kInt; };
  return self.device().type() != kNeuron || !to_neuron || special(self.scalar_type()) ||
         special(dtype.value_or(self.scalar_type()));
}

at::Tensor to_copy(const at::Tensor& self, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                   std::optional<c10::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<c10::MemoryFormat> memory_format) {
  CallContext ctx("aten::_to_copy");
  auto cpu_self = ctx.alias(self);
  const bool to_neuron = !device.has_value() || device->type() == kNeuron;
  if (C10_UNLIKELY(op_tracking_level() != 0) && copies_through_copy_(self, to_neuron, dtype)) track_op("copy_");
  if (to_neuron) {
    check_strided(layout, "to");
    ctx.set_output_device(device.has_value() ? device->index() : self.device().index());
    const bool same_bytes = self.is_cpu() && (!dtype.has_value() || *dtype == self.scalar_type()) &&
                            memory_format.value_or(at::MemoryFormat::Preserve) != at::MemoryFormat::ChannelsLast &&
                            memory_format.value_or(at::MemoryFormat::Preserve) != at::MemoryFormat::ChannelsLast3d;
    if (same_bytes) {
      at::Tensor mapped = map_checkpoint_pages(self, ctx.output_device());
      if (mapped.defined()) {
        ctx.observe_result(mapped);
        return mapped;
      }
    }
  }
  auto result = at::_to_copy(cpu_self, dtype, layout, c10::Device(c10::DeviceType::CPU),
                             to_neuron ? std::nullopt : pin_memory, non_blocking, memory_format);
  if (!to_neuron) return result;
  if (self.is_cpu()) note_copy_to_device(result.nbytes());
  MovingFromHost moving(self.is_cpu());
  return ctx.to_neuron(result);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  // CPU's resize grows the storage through the storage's own allocator: ours.
  CallContext ctx("aten::resize_");
  DeviceScope scope(self.device().index());
  return at::native::resize_(self, size, memory_format);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  CallContext ctx("aten::_local_scalar_dense");
  return at::native::_local_scalar_dense_cpu(ctx.alias(self));
}

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  CallContext ctx("aten::convolution_overrideable");
  auto cpu_input = ctx.alias(input);
  auto cpu_weight = ctx.alias(weight);
  std::optional<at::Tensor> cpu_bias = ctx.alias(bias);
  ctx.check_devices();
  return ctx.to_neuron(at::convolution(cpu_input, cpu_weight, cpu_bias, stride, padding, dilation, transposed,
                                       output_padding, groups));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  CallContext ctx("aten::convolution_backward_overrideable");
  auto cpu_grad = ctx.alias(grad_output);
  auto cpu_input = ctx.alias(input);
  auto cpu_weight = ctx.alias(weight);
  ctx.check_devices();
  const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  auto [gi, gw, gb] = at::convolution_backward(cpu_grad, cpu_input, cpu_weight, c10::IntArrayRef{out_channels},
                                               stride, padding, dilation, transposed, output_padding, groups,
                                               output_mask);
  return {ctx.to_neuron(gi), ctx.to_neuron(gw), ctx.to_neuron(gb)};
}

// Compressed sparse tensors are moved by building the result directly (no op
// runs on the neuron side), so refuse the move here rather than later with a confusing error.
at::Tensor sparse_compressed_to_copy(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                                     std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                     std::optional<bool> pin_memory, bool non_blocking,
                                     std::optional<c10::MemoryFormat> memory_format) {
  const bool dense_result = layout.has_value() && *layout == c10::kStrided;
  TORCH_CHECK_NOT_IMPLEMENTED(!(device.has_value() && device->type() == kNeuron) || dense_result,
                              "sparse (", self.layout(),
                              ") tensors are not supported on neuron. Keep them on the CPU, or convert them "
                              "to dense strided tensors (e.g. .to_dense()) before moving them to neuron.");
  return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
}

}  // namespace

// CPU's choice, under TorchNeuron's name where it registers its own: for 4-D query, key and value
// its _fused_sdp_choice takes the fused overrideable op (which DTensor can shard), computed here by
// CPU's flash kernel; so only where CPU would run that kernel. Functional tensors and wrappers without
// storage (a graph being traced) keep CPU's choice: each executor lowers attention its own way. A
// DTensor's fake local tensors cannot be told from an eager call's: a graph traced from DTensors holds
// the fused op, which fast_ops.cpp also runs on CPU tensors (the host's aliases a graph runs on).
bool traced(const at::Tensor& t) {
  return !t.has_storage() || fake_or_functional(t);
}

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  const int64_t choice = at::_ops::_fused_sdp_choice::redispatch(
      c10::DispatchKeySet(c10::DispatchKey::CPU), query, key, value, attn_mask, dropout_p, is_causal, scale,
      enable_gqa);
  const bool fused = choice == static_cast<int64_t>(at::SDPBackend::flash_attention) && !enable_gqa &&
                     query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && !traced(query);
  return fused ? static_cast<int64_t>(at::SDPBackend::overrideable) : choice;
}

// Work is complete when an op returns, so no stream can still be using the
// memory: nothing to record beyond checking the stream is a neuron one.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kNeuron, "record_stream: expected a neuron stream for a neuron tensor, got a ",
              stream.device_type(), " stream");
}

// `param.data = t` between CPU and neuron (model offloading does it): torch's
// own check knows only its built-in dense backends. Tracked, as TorchNeuron's kernel is.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  track_op("_has_compatible_shallow_copy_type");
  auto dense = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && (t.device().is_cpu() || t.device().type() == kNeuron);
  };
  return (dense(self) && dense(from)) ||
         self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

// CPU's kernel, with the gradients output_mask does not ask for left undefined, as TorchNeuron's
// kernel leaves them (CPU's may compute one anyway: the weight's, on its default route).
void convolution_backward_masked(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::List<bool> mask = stack->back().toBoolList();
  std::array<bool, 3> wanted{mask.get(0), mask.get(1), mask.get(2)};
  neuron_fallback(op, stack);
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (!wanted[i]) (*stack)[stack->size() - wanted.size() + i] = c10::IValue(at::Tensor());
  }
}

// Whether a boolean mask (neuron memory is host memory; a CPU mask is read as is) selects anything.
bool any_selected(const at::Tensor& mask) {
  if (mask.numel() == 0) return false;
  const at::Tensor host = mask.device().is_cpu()
                              ? mask
                              : at::from_blob(mask.data_ptr(), mask.sizes(), mask.strides(),
                                              at::TensorOptions().dtype(at::kBool).device(at::kCPU));
  return host.any().item<bool>();
}

// TorchNeuron's index kernel turns each boolean index into integer indices with its nonzero kernel
// (python_ops/legacy/xla_ops/index_xla.py), and a mask that selects nothing does not end in its index
// kernel (its test_index.py: test_boolean_mask_all_false). Op tracking follows; the values are CPU's.
void index_tracked_as_torchneuron(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  bool selects_nothing = false;
  for (const std::optional<at::Tensor>& index : stack->back().toOptionalTensorList().vec()) {
    if (index.has_value() && index->defined() && index->scalar_type() == at::kBool) {
      track_op("nonzero", index->device().type() == kNeuron ? std::vector<at::Tensor>{*index} : std::vector<at::Tensor>{});
      selects_nothing = selects_nothing || !any_selected(*index);
    }
  }
  UntrackedScope untracked(selects_nothing);
  neuron_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("index.Tensor", torch::CppFunction::makeFromBoxedFunction<&index_tracked_as_torchneuron>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&convolution_backward_masked>());
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("copy_", TORCH_FN(copy_));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_to_copy", TORCH_FN(to_copy));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_overrideable));
}

// Both keys: BackendSelect mixes the target device into the dispatch key.
TORCH_LIBRARY_IMPL(aten, SparseCsrCPU, m) {
  m.impl("_to_copy", TORCH_FN(sparse_compressed_to_copy));
}
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("_to_copy", TORCH_FN(sparse_compressed_to_copy));
}

// Conjugate and negative views must reach _copy_from with their bits intact
// (otherwise the conj fallback materializes by copying, which recurses).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace neuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuron::fused_sdp_choice);
}  // namespace at::native
