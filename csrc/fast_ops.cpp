// Unboxed fast paths for the hottest ops: alias -> CPU kernel -> adopt, with
// no boxing and no second trip through the dispatcher (at::cpu:: calls the
// CPU kernel directly), or, for add, sub, mul, div, silu and the optimizers'
// lerp_, addcmul_, addcdiv_ and sqrt on neuron operands, CPU's structured kernel
// run on the neuron tensors themselves (the direct path).
// Results and semantics are the fallback's.
#include "dispatch.h"

#include <ATen/CPUFunctions.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/silu_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/native/Activation.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/Lerp.h>
#include <ATen/native/PointwiseOps.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/TensorIterator.h>
#include <torch/library.h>

namespace neuron {
namespace {

// Dense neuron operands (of one dtype, on one device): CPU's structured kernel runs on the neuron
// tensors themselves. Neuron memory is host memory, and the kernel's DispatchStub forwards PrivateUse1
// to CPU's code (install_direct_stubs), so this skips making CPU aliases and adopting the result.
// Anything else (mixed dtypes or devices, CPU scalars, complex, conj/neg bits) takes the alias path.
bool direct_operand(const at::Tensor& a) {
#if !defined(NEURON_DIRECT_CPU_STUBS)
  return false;  // this build cannot name CPU's DispatchStub kernels (see setup.py)
#endif
  return a.device().type() == kNeuron && !a.is_complex() && a.layout() == at::kStrided && !a.is_conj() &&
         !a.is_neg() && !a._is_zerotensor();
}

bool direct_operands(const at::Tensor& a, const at::Tensor& b) {
  return a.device() == b.device() && a.scalar_type() == b.scalar_type() && direct_operand(a) && direct_operand(b);
}

#if defined(NEURON_DIRECT_CPU_STUBS)
void add_on_cpu(at::TensorIteratorBase& iter, const c10::Scalar& alpha) {
  at::native::add_stub(c10::DeviceType::CPU, iter, alpha);
}
void mul_on_cpu(at::TensorIteratorBase& iter) { at::native::mul_stub(c10::DeviceType::CPU, iter); }
void div_true_on_cpu(at::TensorIteratorBase& iter) { at::native::div_true_stub(c10::DeviceType::CPU, iter); }
void silu_on_cpu(at::TensorIteratorBase& iter) { at::native::silu_stub(c10::DeviceType::CPU, iter); }
void lerp_scalar_on_cpu(at::TensorIteratorBase& iter, const c10::Scalar& weight) {
  at::native::lerp_kernel_scalar_weight(c10::DeviceType::CPU, iter, weight);
}
void addcmul_on_cpu(at::TensorIteratorBase& iter, const c10::Scalar& value) {
  at::native::addcmul_stub(c10::DeviceType::CPU, iter, value);
}
void addcdiv_on_cpu(at::TensorIteratorBase& iter, const c10::Scalar& value) {
  at::native::addcdiv_stub(c10::DeviceType::CPU, iter, value);
}
void sqrt_on_cpu(at::TensorIteratorBase& iter) { at::native::sqrt_stub(c10::DeviceType::CPU, iter); }
#endif

// A CPU structured kernel (``Kernel``: its meta computes shape, dtype and strides into a TensorIterator,
// its impl runs the loop) in its functional form, as torch's generated CPU wrapper runs it, but with
// the output allocated straight from the neuron allocator: no dispatch of empty, no out= checks, and
// the output's strides (memory format) are CPU's.
template <class Kernel>
struct NeuronFunctional final : Kernel {
  void set_output_strided(int64_t index, at::IntArrayRef sizes, at::IntArrayRef strides,
                          at::TensorOptions options) override {
    set_output_raw_strided(index, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t index, at::IntArrayRef sizes, at::IntArrayRef strides,
                              at::TensorOptions options) override {
    const c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
    const auto dtype = options.dtype().toScalarType();
    count_allocation();
    output = strides.empty()
                 ? at::detail::empty_generic(sizes, neuron_allocator(), keys, dtype, options.memory_format_opt())
                 : at::detail::empty_strided_generic(sizes, strides, neuron_allocator(), keys, dtype);
    Kernel::set_output_raw_strided(index, sizes, strides, options);  // after: it reads the output
  }
  const at::Tensor& maybe_get_output(int64_t) override { return output; }
  at::Tensor output;
};

// Runs the kernel functionally on neuron operands; the output lands on their device.
template <class Kernel, class... Args>
at::Tensor run_direct(c10::DeviceIndex device, const Args&... args) {
  DeviceScope scope(device);  // the neuron allocator allocates on the current device
  NeuronFunctional<Kernel> op;
  op.meta(args...);
  op.impl(args..., op.output);
  return std::move(op.output);
}

// The functional form: when ``WHEN`` holds and the operands qualify, ``KERNEL`` runs on them directly.
#define NEURON_DIRECT_BINARY(WHEN, KERNEL, ...)                                                          \
  if ((WHEN) && direct_operands(a, b)) {                                                                \
    at::Tensor out = run_direct<at::native::KERNEL>(a.device().index(), __VA_ARGS__);                  \
    ctx.observe({&a, &b}, out);                                                                         \
    return out;                                                                                         \
  }

// The in-place form: CPU's kernel writes into the neuron tensor ``a`` itself.
#define NEURON_DIRECT_INPLACE(WHEN, CALL)                           \
  if (WHEN) {                                                       \
    CALL;                                                           \
    ctx.observe({&a, &b}, a);                                       \
    return a;                                                       \
  }

// Binary elementwise ops with an alpha (add, sub) and without (mul, div):
// functional, in-place and out= forms.
#define NEURON_BINARY_WITH_ALPHA(OP, KERNEL)                                                            \
  at::Tensor OP##_tensor(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {    \
    CallContext ctx("aten::" #OP ".Tensor");                                                      \
    NEURON_DIRECT_BINARY(true, KERNEL, a, b, alpha)                                                 \
    auto ca = ctx.alias(a), cb = ctx.alias(b);                                                    \
    ctx.check_devices();                                                                          \
    return ctx.to_neuron(at::cpu::OP(ca, cb, alpha));                                             \
  }                                                                                               \
  at::Tensor& OP##_inplace(at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {        \
    CallContext ctx("aten::" #OP "_.Tensor");                                                     \
    NEURON_DIRECT_INPLACE(direct_operands(a, b), at::cpu::OP##_(a, b, alpha))                     \
    auto ca = ctx.alias(a), cb = ctx.alias(b);                                                    \
    ctx.check_devices();                                                                          \
    at::cpu::OP##_(ca, cb, alpha);                                                                \
    return a;                                                                                     \
  }                                                                                               \
  at::Tensor& OP##_out(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha,        \
                       at::Tensor& out) {                                                         \
    CallContext ctx("aten::" #OP ".out");                                                         \
    auto ca = ctx.alias(a), cb = ctx.alias(b), co = ctx.alias(out);                               \
    ctx.check_devices();                                                                          \
    at::cpu::OP##_out(co, ca, cb, alpha);                                                         \
    ctx.sync_mutated();                                                                           \
    return out;                                                                                   \
  }

// DIRECT: a NEURON_DIRECT_BINARY, or nothing (always the alias path).
#define NEURON_BINARY_FUNCTIONAL_AND_OUT(OP, NAME, DIRECT)                                        \
  at::Tensor OP##_tensor(const at::Tensor& a, const at::Tensor& b) {                              \
    CallContext ctx(NAME);                                                                        \
    DIRECT                                                                                        \
    auto ca = ctx.alias(a), cb = ctx.alias(b);                                                    \
    ctx.check_devices();                                                                          \
    return ctx.to_neuron(at::cpu::OP(ca, cb));                                                    \
  }                                                                                               \
  at::Tensor& OP##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {               \
    CallContext ctx("aten::" #OP ".out");                                                         \
    auto ca = ctx.alias(a), cb = ctx.alias(b), co = ctx.alias(out);                               \
    ctx.check_devices();                                                                          \
    at::cpu::OP##_out(co, ca, cb);                                                                \
    ctx.sync_mutated();                                                                           \
    return out;                                                                                   \
  }

#define NEURON_BINARY_INPLACE(OP, DIRECT)                                                               \
  at::Tensor& OP##_inplace(at::Tensor& a, const at::Tensor& b) {                                  \
    CallContext ctx("aten::" #OP "_.Tensor");                                                     \
    NEURON_DIRECT_INPLACE(DIRECT, at::cpu::OP##_(a, b))                                           \
    auto ca = ctx.alias(a), cb = ctx.alias(b);                                                    \
    ctx.check_devices();                                                                          \
    at::cpu::OP##_(ca, cb);                                                                       \
    return a;                                                                                     \
  }

NEURON_BINARY_WITH_ALPHA(add, structured_ufunc_add_CPU)
NEURON_BINARY_WITH_ALPHA(sub, structured_sub_out)
NEURON_BINARY_FUNCTIONAL_AND_OUT(mul, "aten::mul.Tensor", NEURON_DIRECT_BINARY(true, structured_mul_out, a, b))
NEURON_BINARY_INPLACE(mul, direct_operands(a, b))
NEURON_BINARY_FUNCTIONAL_AND_OUT(div, "aten::div.Tensor",
                                 NEURON_DIRECT_BINARY(a.is_floating_point(), structured_div_out, a, b))
NEURON_BINARY_INPLACE(div, direct_operands(a, b) && a.is_floating_point())
NEURON_BINARY_FUNCTIONAL_AND_OUT(mm, "aten::mm", check_mm_operands(a, b);)
NEURON_BINARY_FUNCTIONAL_AND_OUT(bmm, "aten::bmm", )

at::Tensor addmm(const at::Tensor& self, const at::Tensor& m1, const at::Tensor& m2, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  CallContext ctx("aten::addmm");
  auto cs = ctx.alias(self), c1 = ctx.alias(m1), c2 = ctx.alias(m2);
  ctx.check_devices();
  return ctx.to_neuron(at::cpu::addmm(cs, c1, c2, beta, alpha));
}

at::Tensor& addmm_inplace(at::Tensor& self, const at::Tensor& m1, const at::Tensor& m2, const at::Scalar& beta,
                          const at::Scalar& alpha) {
  CallContext ctx("aten::addmm_");
  auto cs = ctx.alias(self), c1 = ctx.alias(m1), c2 = ctx.alias(m2);
  ctx.check_devices();
  at::cpu::addmm_(cs, c1, c2, beta, alpha);
  return self;
}

at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& m1, const at::Tensor& m2, const at::Scalar& beta,
                      const at::Scalar& alpha, at::Tensor& out) {
  CallContext ctx("aten::addmm.out");
  auto cs = ctx.alias(self), c1 = ctx.alias(m1), c2 = ctx.alias(m2), co = ctx.alias(out);
  ctx.check_devices();
  at::cpu::addmm_out(co, cs, c1, c2, beta, alpha);
  ctx.sync_mutated();
  return out;
}

at::Tensor softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  CallContext ctx("aten::_softmax");
  auto cpu_self = ctx.alias(self);
  if (half_to_float && self.scalar_type() == at::kHalf) {
    // CPU refuses half_to_float; TorchNeuron (as CUDA) returns the float32 softmax of the half input.
    return ctx.to_neuron(at::cpu::_softmax(cpu_self.to(at::kFloat), dim, false));
  }
  return ctx.to_neuron(at::cpu::_softmax(cpu_self, dim, half_to_float));
}

// amax/amin with out=: TorchNeuron checks the out tensor's dtype first, a TypeError in torch's dtype
// names (CPU's check is a RuntimeError); then the op runs as any other, on CPU aliases.
void reduction_out_of_input_dtype(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t first = stack->size() - op.schema().arguments().size();
  const at::Tensor& self = (*stack)[first].toTensor();
  const at::Tensor& out = stack->back().toTensor();
  TORCH_CHECK_TYPE(self.scalar_type() == out.scalar_type(),
                   "Expected the dtype for input and out to match, but got torch.",
                   c10::getDtypeNames(self.scalar_type()).first, " for input's dtype and torch.",
                   c10::getDtypeNames(out.scalar_type()).first, " for out's dtype.");
  neuron_fallback(op, stack);
}

at::Tensor gelu(const at::Tensor& self, c10::string_view approximate) {
  CallContext ctx("aten::gelu");
  return ctx.to_neuron(at::cpu::gelu(ctx.alias(self), approximate));
}

at::Tensor& gelu_inplace(at::Tensor& self, c10::string_view approximate) {
  CallContext ctx("aten::gelu_");
  auto cs = ctx.alias(self);
  at::cpu::gelu_(cs, approximate);
  return self;
}

at::Tensor silu(const at::Tensor& self) {
  CallContext ctx("aten::silu");
  if (direct_operand(self)) {
    at::Tensor out = run_direct<at::native::structured_silu_out>(self.device().index(), self);
    ctx.observe({&self}, out);
    return out;
  }
  return ctx.to_neuron(at::cpu::silu(ctx.alias(self)));
}

at::Tensor& silu_inplace(at::Tensor& self) {
  CallContext ctx("aten::silu_");
  if (direct_operand(self)) {
    at::cpu::silu_(self);
    ctx.observe({&self}, self);
    return self;
  }
  auto cs = ctx.alias(self);
  at::cpu::silu_(cs);
  return self;
}

// The optimizers' pointwise ops (AdamW's foreach loop calls them once per
// parameter): in place on neuron operands of one dtype and device, CPU's kernel
// writes into the neuron tensor itself; else the alias path.
at::Tensor& lerp_scalar_inplace(at::Tensor& self, const at::Tensor& end, const at::Scalar& weight) {
  CallContext ctx("aten::lerp_.Scalar");
  if (direct_operands(self, end)) {
    at::cpu::lerp_(self, end, weight);
    ctx.observe({&self, &end}, self);
    return self;
  }
  auto cs = ctx.alias(self), ce = ctx.alias(end);
  ctx.check_devices();
  at::cpu::lerp_(cs, ce, weight);
  return self;
}

// In place with a Python number (the optimizers' foreach loops: weight decay, beta2, eps, bias
// correction). CPU wraps the number in a 0-dim tensor that its TensorIterator casts to the tensor's
// dtype; for float32/float64 that cast is made here and CPU's kernel writes into the neuron tensor,
// the number a CPU scalar operand. Anything else goes to the host fallback, as before.
bool direct_scalar_operands(const at::Tensor& a, const at::Scalar& s) {
  return direct_operand(a) && (a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble) && !s.isComplex();
}

at::Tensor cpu_scalar_as(const at::Tensor& a, const at::Scalar& s) {
  return at::scalar_tensor(s, at::TensorOptions().dtype(a.scalar_type()).device(at::kCPU));
}

template <class... Args>
at::Tensor& run_on_host_fallback(const c10::OperatorHandle& op, at::Tensor& self, const Args&... args) {
  torch::jit::Stack stack;
  torch::jit::push(stack, self, args...);
  neuron_fallback(op, &stack);
  return self;
}

// PARAMS: the op's arguments after self; ARGS: the same, passed on.
#define NEURON_SCALAR_INPLACE(OP, NAME, PARAMS, ARGS, CALL)                                            \
  at::Tensor& OP##_scalar_inplace PARAMS {                                                             \
    if (direct_scalar_operands(self, other)) {                                                         \
      CallContext ctx("aten::" NAME ".Scalar");                                                        \
      const at::Tensor number = cpu_scalar_as(self, other);                                            \
      CALL;                                                                                            \
      ctx.observe({&self}, self);                                                                      \
      return self;                                                                                     \
    }                                                                                                  \
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::" NAME, "Scalar");    \
    return run_on_host_fallback ARGS;                                                                  \
  }

NEURON_SCALAR_INPLACE(add, "add_", (at::Tensor& self, const at::Scalar& other, const at::Scalar& alpha),
                      (op, self, other, alpha), at::cpu::add_(self, number, alpha))
NEURON_SCALAR_INPLACE(mul, "mul_", (at::Tensor& self, const at::Scalar& other), (op, self, other),
                      at::cpu::mul_(self, number))
NEURON_SCALAR_INPLACE(div, "div_", (at::Tensor& self, const at::Scalar& other), (op, self, other),
                      at::cpu::div_(self, number))

#define NEURON_POINTWISE_INPLACE(OP)                                                                       \
  at::Tensor& OP##_inplace(at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,                  \
                           const at::Scalar& value) {                                                     \
    CallContext ctx("aten::" #OP "_");                                                                     \
    if (direct_operands(self, t1) && direct_operands(self, t2)) {                                          \
      at::cpu::OP##_(self, t1, t2, value);                                                                 \
      ctx.observe({&self, &t1, &t2}, self);                                                                \
      return self;                                                                                         \
    }                                                                                                      \
    auto cs = ctx.alias(self), c1 = ctx.alias(t1), c2 = ctx.alias(t2);                                     \
    ctx.check_devices();                                                                                   \
    at::cpu::OP##_(cs, c1, c2, value);                                                                     \
    return self;                                                                                           \
  }

NEURON_POINTWISE_INPLACE(addcmul)
NEURON_POINTWISE_INPLACE(addcdiv)

at::Tensor sqrt(const at::Tensor& self) {
  CallContext ctx("aten::sqrt");
  if (direct_operand(self) && self.is_floating_point()) {  // an integer input would need a cast to float first
    at::Tensor out = run_direct<at::native::structured_sqrt_out>(self.device().index(), self);
    ctx.observe({&self}, out);
    return out;
  }
  return ctx.to_neuron(at::cpu::sqrt(ctx.alias(self)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(const at::Tensor& input,
                                                                 c10::IntArrayRef normalized_shape,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias,
                                                                 double eps) {
  CallContext ctx("aten::native_layer_norm");
  auto ci = ctx.alias(input);
  std::optional<at::Tensor> cw = ctx.alias(weight);
  std::optional<at::Tensor> cb = ctx.alias(bias);
  ctx.check_devices();
  auto [out, mean, rstd] = at::cpu::native_layer_norm(ci, normalized_shape, cw, cb, eps);
  return {ctx.to_neuron(out), ctx.to_neuron(mean), ctx.to_neuron(rstd)};
}

at::Tensor cat(const at::ITensorListRef& tensors, int64_t dim) {
  CallContext ctx("aten::cat");
  std::vector<at::Tensor> aliases;
  aliases.reserve(tensors.size());
  for (const at::Tensor& t : tensors) aliases.push_back(ctx.alias(t));
  ctx.check_devices();
  return ctx.to_neuron(at::cpu::cat(aliases, dim));
}

// CPU's flash kernel on the aliases of one call's arguments: its output and log-sum-exp on neuron.
std::tuple<at::Tensor, at::Tensor> flash_on_host(CallContext& ctx, const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const std::optional<at::Tensor>& attn_mask,
                                                 double dropout_p, bool is_causal, std::optional<double> scale) {
  auto cq = ctx.alias(q), ck = ctx.alias(k), cv = ctx.alias(v);
  std::optional<at::Tensor> cm = ctx.alias(attn_mask);
  ctx.check_devices();
  auto [out, logsumexp] = at::cpu::_scaled_dot_product_flash_attention_for_cpu(cq, ck, cv, dropout_p, is_causal,
                                                                              cm, scale);
  return {ctx.to_neuron(out), ctx.to_neuron(logsumexp)};
}

std::tuple<at::Tensor, at::Tensor> sdpa_flash_for_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      double dropout_p, bool is_causal,
                                                      const std::optional<at::Tensor>& attn_mask,
                                                      std::optional<double> scale) {
  CallContext ctx("aten::_scaled_dot_product_flash_attention_for_cpu");
  return flash_on_host(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale);
}

// The fused op's philox state: zero (CPU's flash attention draws nothing); no op calls, so profiles
// show CPU's ops and the fused one only.
at::Tensor zero_philox_state() {
  at::Tensor state = at::detail::empty_cpu({}, at::kLong, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  *state.data_ptr<int64_t>() = 0;
  return state;
}

// TorchNeuron's fused attention op (chosen for 4-D inputs by fused_sdp_choice), computed by CPU's
// flash kernel, which CPU's SDPA would have run: the same values, under the op DTensor can shard.
// Its outputs beyond the values are what its meta function gives: no varlen offsets, zero philox
// state (CPU's flash attention draws nothing), no debug mask.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor,
           at::Tensor>
sdpa_overrideable(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal, bool,
                  std::optional<double> scale) {
  CallContext ctx("aten::_scaled_dot_product_fused_attention_overrideable");
  auto [out, logsumexp] = flash_on_host(ctx, q, k, v, attn_bias, dropout_p, is_causal, scale);
  return {out, logsumexp, at::Tensor(), at::Tensor(), c10::SymInt(q.size(2)), c10::SymInt(k.size(2)),
          ctx.to_neuron(zero_philox_state()), ctx.to_neuron(zero_philox_state()), at::Tensor()};
}

// On CPU tensors: a compiled graph runs on the host's aliases, and a graph traced with this op (a
// DTensor's: its fake tensors ask neuron's choice) calls it with them.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor,
           at::Tensor>
sdpa_overrideable_on_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal, bool,
                         std::optional<double> scale) {
  auto [out, logsumexp] = at::cpu::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal,
                                                                              attn_bias, scale);
  return {out, logsumexp, at::Tensor(), at::Tensor(), c10::SymInt(q.size(2)), c10::SymInt(k.size(2)),
          zero_philox_state(), zero_philox_state(), at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_overrideable_backward_on_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& attn_bias, std::array<bool, 4>, const at::Tensor& out, const at::Tensor& logsumexp,
    const at::Tensor&, const at::Tensor&, c10::SymInt, c10::SymInt, double dropout_p, bool is_causal,
    const at::Tensor&, const at::Tensor&, std::optional<double> scale) {
  // CPU's gradient of its flash kernel (no gradient for the mask, as there).
  std::optional<at::Tensor> bias;
  if (attn_bias.defined()) bias = attn_bias;
  auto [gq, gk, gv] = at::cpu::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, logsumexp,
                                                                                   dropout_p, is_causal, bias, scale);
  return {gq, gk, gv, at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_overrideable_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, c10::SymInt max_q,
    c10::SymInt max_k, double dropout_p, bool is_causal, const at::Tensor& philox_seed,
    const at::Tensor& philox_offset, std::optional<double> scale) {
  CallContext ctx("aten::_scaled_dot_product_fused_attention_overrideable_backward");
  auto cg = ctx.alias(grad_out), cq = ctx.alias(q), ck = ctx.alias(k), cv = ctx.alias(v);
  auto co = ctx.alias(out), cl = ctx.alias(logsumexp), cb = ctx.alias(attn_bias);
  ctx.check_devices();
  auto [gq, gk, gv, gb] = sdpa_overrideable_backward_on_cpu(cg, cq, ck, cv, cb, grad_input_mask, co, cl, cum_seq_q,
                                                            cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                                            philox_seed, philox_offset, scale);
  return {ctx.to_neuron(gq), ctx.to_neuron(gk), ctx.to_neuron(gv), gb};
}

}  // namespace

void install_direct_stubs() {
#if defined(NEURON_DIRECT_CPU_STUBS)
  at::native::add_stub.set_privateuse1_dispatch_ptr(&add_on_cpu);  // add and sub
  at::native::mul_stub.set_privateuse1_dispatch_ptr(&mul_on_cpu);
  at::native::div_true_stub.set_privateuse1_dispatch_ptr(&div_true_on_cpu);
  at::native::silu_stub.set_privateuse1_dispatch_ptr(&silu_on_cpu);
  at::native::lerp_kernel_scalar_weight.set_privateuse1_dispatch_ptr(&lerp_scalar_on_cpu);
  at::native::addcmul_stub.set_privateuse1_dispatch_ptr(&addcmul_on_cpu);
  at::native::addcdiv_stub.set_privateuse1_dispatch_ptr(&addcdiv_on_cpu);
  at::native::sqrt_stub.set_privateuse1_dispatch_ptr(&sqrt_on_cpu);
#endif
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  install_direct_stubs();
  m.impl("add.Tensor", TORCH_FN(add_tensor));
  m.impl("add_.Tensor", TORCH_FN(add_inplace));
  m.impl("add.out", TORCH_FN(add_out));
  m.impl("sub.Tensor", TORCH_FN(sub_tensor));
  m.impl("sub_.Tensor", TORCH_FN(sub_inplace));
  m.impl("sub.out", TORCH_FN(sub_out));
  m.impl("mul.Tensor", TORCH_FN(mul_tensor));
  m.impl("mul_.Tensor", TORCH_FN(mul_inplace));
  m.impl("mul.out", TORCH_FN(mul_out));
  m.impl("div.Tensor", TORCH_FN(div_tensor));
  m.impl("div_.Tensor", TORCH_FN(div_inplace));
  m.impl("div.out", TORCH_FN(div_out));
  m.impl("mm", TORCH_FN(mm_tensor));
  m.impl("mm.out", TORCH_FN(mm_out));
  m.impl("bmm", TORCH_FN(bmm_tensor));
  m.impl("bmm.out", TORCH_FN(bmm_out));
  m.impl("addmm", TORCH_FN(addmm));
  m.impl("addmm_", TORCH_FN(addmm_inplace));
  m.impl("addmm.out", TORCH_FN(addmm_out));
  m.impl("_softmax", TORCH_FN(softmax));
  m.impl("amax.out", torch::CppFunction::makeFromBoxedFunction<&reduction_out_of_input_dtype>());
  m.impl("amin.out", torch::CppFunction::makeFromBoxedFunction<&reduction_out_of_input_dtype>());
  m.impl("gelu", TORCH_FN(gelu));
  m.impl("gelu_", TORCH_FN(gelu_inplace));
  m.impl("silu", TORCH_FN(silu));
  m.impl("silu_", TORCH_FN(silu_inplace));
  m.impl("add_.Scalar", TORCH_FN(add_scalar_inplace));
  m.impl("mul_.Scalar", TORCH_FN(mul_scalar_inplace));
  m.impl("div_.Scalar", TORCH_FN(div_scalar_inplace));
  m.impl("lerp_.Scalar", TORCH_FN(lerp_scalar_inplace));
  m.impl("addcmul_", TORCH_FN(addcmul_inplace));
  m.impl("addcdiv_", TORCH_FN(addcdiv_inplace));
  m.impl("sqrt", TORCH_FN(sqrt));
  m.impl("native_layer_norm", TORCH_FN(native_layer_norm));
  m.impl("cat", TORCH_FN(cat));
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(sdpa_overrideable));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(sdpa_overrideable_backward));
  m.impl("_scaled_dot_product_flash_attention_for_cpu", TORCH_FN(sdpa_flash_for_cpu));
}

TORCH_LIBRARY_IMPL(aten, CPU, m) {
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(sdpa_overrideable_on_cpu));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(sdpa_overrideable_backward_on_cpu));
}

}  // namespace neuron
