// aten::contiguous for neuron, as TorchNeuron registers it (its python_ops/contiguous.py, with an
// autograd kernel): preserve_format means contiguous (CPU refuses preserve), and any other format
// (channels_last, channels_last_3d) is refused on Trainium (validate_neuron_memory_format). PyTorch's
// composite would turn the call into a clone above autograd, where neither TrainiumSemantics' mode
// nor the observer can tell it from any other copy. Values are always CPU's (its composite).
#include "dispatch.h"

#include <ATen/ops/contiguous_native.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace neuron {
namespace {

bool format_trainium_takes(c10::MemoryFormat format) {
  return format == c10::MemoryFormat::Contiguous || format == c10::MemoryFormat::Preserve;
}

// Below autograd (after TrainiumSemantics' mode, which raises for a refused format): CPU's result. A
// refused format is observed under the op's name: the readiness report's "would fail" finding.
at::Tensor contiguous_neuron(const at::Tensor& self, c10::MemoryFormat format) {
  if (format_trainium_takes(format)) return at::native::contiguous(self, c10::MemoryFormat::Contiguous);
  CallContext ctx("aten::contiguous");
  return ctx.to_neuron(at::native::contiguous(ctx.alias(self), format));
}

// A refused format with autograd: the call goes below autograd (where it is checked and observed)
// and its gradient is the incoming one, as for the clone PyTorch would have made.
struct RefusedFormat : public torch::autograd::Function<RefusedFormat> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& self, c10::DispatchKeySet keys,
                            c10::MemoryFormat format) {
    at::AutoDispatchBelowADInplaceOrView below;
    return at::_ops::contiguous::redispatch(keys & c10::after_autograd_keyset, self, format);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

at::Tensor contiguous_autograd(c10::DispatchKeySet keys, const at::Tensor& self, c10::MemoryFormat format) {
  if (format_trainium_takes(format) || wrapped_by_python(self)) {
    // A FakeTensor or DTensor while a graph is traced: its composite, as PyTorch's, except preserve.
    return at::native::contiguous(self, format == c10::MemoryFormat::Preserve ? c10::MemoryFormat::Contiguous
                                                                                : format);
  }
  return RefusedFormat::apply(self, keys, format);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("contiguous", TORCH_FN(contiguous_neuron)); }
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { m.impl("contiguous", TORCH_FN(contiguous_autograd)); }

}  // namespace neuron
