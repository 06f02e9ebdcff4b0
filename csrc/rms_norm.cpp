// rms_norm as TorchNeuron runs it (its python_ops/rms_norm.py): a half-precision input beside a
// weight of another dtype goes to float32, then one _fused_rms_norm call, whose gradient is one
// _fused_rms_norm_backward call (PyTorch has kernels for both on CUDA and MPS only). Both compute what
// CPU's rms_norm computes on the same bytes: the forward is PyTorch's composite, which CPU's rms_norm
// runs; the backward runs the ops CPU's autograd runs through that composite, in its order and dtypes.
#include "dispatch.h"

#include <ATen/ExpandUtils.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/_fused_rms_norm.h>
#include <ATen/ops/_fused_rms_norm_compositeimplicitautograd_dispatch.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/library.h>

namespace neuron {
namespace {

using c10::impl::TorchDispatchModeKey;
using c10::impl::TorchDispatchModeTLS;

bool traced_mode() {
  return TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FUNCTIONAL).has_value();
}

// A FakeTensor (its storage is on meta) or functional tensor, or any wrapper while a graph is traced:
// the graph holds CPU's composite, as Inductor on CPU traces it. An eager DTensor is not: it shards
// _fused_rms_norm and its backward itself, as on TorchNeuron.
bool traced(const at::Tensor& t) { return wrapped_by_python(t) && (fake_or_functional(t) || traced_mode()); }

bool half(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// AutogradPrivateUse1: autograd records _fused_rms_norm's own node (its backward calls
// _fused_rms_norm_backward), not the composite's parts.
at::Tensor rms_norm(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                    const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  const at::IntArrayRef shape = C10_AS_INTARRAYREF_SLOW(normalized_shape);
  if (traced(input) || (weight.has_value() && traced(*weight))) {
    return std::get<0>(at::compositeimplicitautograd::_fused_rms_norm(input, shape, weight, eps));
  }
  const bool upcast = weight.has_value() && weight->defined() && weight->scalar_type() != input.scalar_type() &&
                      half(input.scalar_type());
  if (!upcast) return std::get<0>(at::_fused_rms_norm(input, shape, weight, eps));
  const at::Tensor out = std::get<0>(at::_fused_rms_norm(input.to(at::kFloat), shape, weight->to(at::kFloat), eps));
  return out.to(input.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> fused_rms_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                                                  const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  if (op_tracking_level() >= 2) {  // diagnostics observe the parts, which a traced graph holds
    NamedCall call("aten::_fused_rms_norm");
    return at::compositeimplicitautograd::_fused_rms_norm(input, normalized_shape, weight, eps);
  }
  CallContext ctx("aten::_fused_rms_norm");
  const at::Tensor ci = ctx.alias(input);
  const std::optional<at::Tensor> cw = ctx.alias(weight);
  ctx.check_devices();
  auto [out, rstd] = at::compositeimplicitautograd::_fused_rms_norm(ci, normalized_shape, cw, eps);
  return {ctx.to_neuron(out), ctx.to_neuron(rstd)};
}

// A gradient as the autograd engine hands it to an input: summed to its shape, then cast to its dtype.
at::Tensor as_gradient_of(const at::Tensor& grad, const at::Tensor& input) {
  at::Tensor g = at::sum_to(grad, input.sizes());
  return g.scalar_type() == input.scalar_type() ? g : g.to(input.scalar_type());
}

// other * fresh, in fresh's buffer when both are contiguous and the product keeps fresh's dtype: no
// one else sees that buffer, multiplication commutes bit for bit, and the product's layout (which
// orders a later sum) is CPU's.
at::Tensor times(const at::Tensor& other, at::Tensor fresh) {
  const bool in_place = fresh.is_contiguous() && other.is_contiguous() &&
                        fresh.scalar_type() == at::result_type(fresh, other) && fresh.sizes() == other.sizes();
  return in_place ? fresh.mul_(other) : other.mul(fresh);
}

// What CPU's autograd computes through the composite (x upcast, pow 2, mean, add eps, rsqrt, mul,
// mul weight, cast back), node by node, from the saved rstd: derivatives.yaml's formulas for
// _to_copy, mul, rsqrt, mean and pow, and the engine's sum and cast of each input's gradient.
std::tuple<at::Tensor, at::Tensor> rms_norm_gradients(const at::Tensor& grad_out, const at::Tensor& input,
                                                      at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                                      const std::optional<at::Tensor>& weight,
                                                      std::array<bool, 2> output_mask) {
  const bool has_weight = weight.has_value() && weight->defined();
  const at::ScalarType opmath = at::toOpMathType(input.scalar_type());
  const at::Tensor upcast = input.scalar_type() == opmath ? input : input.to(opmath);
  const at::ScalarType out_type = has_weight ? at::promote_types(opmath, weight->scalar_type()) : opmath;
  const at::Tensor grad = grad_out.scalar_type() == out_type ? grad_out : grad_out.to(out_type);

  at::Tensor grad_weight;
  at::Tensor grad_normalized = grad;
  if (has_weight) {
    // grad * (x * rstd), the forward's normalized x, which CPU's autograd saved
    if (output_mask[1]) grad_weight = as_gradient_of(times(grad, upcast.mul(rstd)), *weight);
    if (output_mask[0]) grad_normalized = grad.mul(*weight);
  }
  if (!output_mask[0]) return {at::Tensor(), grad_weight};

  const at::Tensor grad_upcast = grad_normalized.mul(rstd);
  const at::Tensor grad_rstd = as_gradient_of(grad_normalized.mul(upcast), rstd);
  const at::Tensor grad_mean = grad_rstd.mul(-0.5).mul(rstd.pow(3));  // rsqrt: -0.5 * grad * result^3
  int64_t count = 1;
  for (int64_t d = input.dim() - static_cast<int64_t>(normalized_shape.size()); d < input.dim(); ++d) {
    count *= input.size(d);
  }
  const at::Tensor grad_square = grad_mean.expand(upcast.sizes()).div(c10::Scalar(count));
  const at::Tensor grad_pow = times(grad_square, upcast.pow(1.0).mul_(2.0));  // pow 2: grad * (2 * x^1)
  // The engine adds the two gradients of x in place where it can (the sum is the same either way round).
  const bool in_place = grad_upcast.is_contiguous() && grad_pow.is_contiguous() &&
                        grad_upcast.scalar_type() == grad_pow.scalar_type();
  const at::Tensor grad_input =
      as_gradient_of(in_place ? grad_upcast.add_(grad_pow) : grad_upcast.add(grad_pow), input);
  return {grad_input, grad_weight};
}

std::tuple<at::Tensor, at::Tensor> fused_rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                           at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                                           const std::optional<at::Tensor>& weight,
                                                           std::array<bool, 2> output_mask) {
  if (op_tracking_level() >= 2) {
    NamedCall call("aten::_fused_rms_norm_backward");
    return rms_norm_gradients(grad_out, input, normalized_shape, rstd, weight, output_mask);
  }
  CallContext ctx("aten::_fused_rms_norm_backward");
  const at::Tensor cg = ctx.alias(grad_out), ci = ctx.alias(input), cr = ctx.alias(rstd);
  const std::optional<at::Tensor> cw = ctx.alias(weight);
  ctx.check_devices();
  auto [grad_input, grad_weight] = rms_norm_gradients(cg, ci, normalized_shape, cr, cw, output_mask);
  return {grad_input.defined() ? ctx.to_neuron(grad_input) : grad_input,
          grad_weight.defined() ? ctx.to_neuron(grad_weight) : grad_weight};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { m.impl("rms_norm", TORCH_FN(rms_norm)); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_rms_norm", TORCH_FN(fused_rms_norm));
  m.impl("_fused_rms_norm_backward", TORCH_FN(fused_rms_norm_backward));
}

}  // namespace neuron
