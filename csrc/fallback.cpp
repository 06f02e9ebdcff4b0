// The boxed fallback: every aten op without a neuron kernel of its own runs
// PyTorch's CPU kernel on CPU aliases of its neuron arguments (no copies).
#include "dispatch.h"

#include <ATen/ThreadLocalPythonObjects.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

namespace neuron {
namespace {

// Tensor[], Tensor?[] and Tensor[][] arguments. Tensor?[] is an index list:
// CPU index tensors beside neuron tensors are allowed, as on CUDA.
c10::IValue alias_list(CallContext& ctx, const c10::IValue& value) {
  auto list = value.toList();
  const auto& element_type = list.elementType();
  const auto kind = element_type->kind();
  if (kind != c10::TypeKind::TensorType && kind != c10::TypeKind::OptionalType &&
      kind != c10::TypeKind::ListType) {
    return value;
  }
  const bool cpu_ok = kind == c10::TypeKind::OptionalType;
  c10::impl::GenericList out(element_type);
  out.reserve(list.size());
  for (const c10::IValue& element : list) {
    if (element.isTensor()) {
      out.push_back(ctx.alias(element.toTensor(), cpu_ok));
    } else if (element.isList()) {
      out.push_back(alias_list(ctx, element));
    } else {
      out.push_back(element);
    }
  }
  return out;
}

// A neuron tensor in an index list (`Tensor?[] indices`) that is not on the indexed tensor's device
// (`indexed`): cpu_t[neuron_idx], or t[idx_on_another_neuron_device]. CPU indices are fine anywhere.
bool has_index_off_device(const c10::Argument& arg, const c10::IValue& value, const c10::Device& indexed) {
  if (!value.isList() || arg.name() != "indices") return false;
  if (value.toList().elementType()->kind() != c10::TypeKind::OptionalType) return false;
  for (const c10::IValue& element : value.toListRef()) {
    if (!element.isTensor()) continue;
    const auto& index = element.toTensor();
    if (index.defined() && index.device().type() == kNeuron && index.device() != indexed) return true;
  }
  return false;
}

c10::IValue results_to_neuron(CallContext& ctx, const c10::IValue& value) {
  if (value.isTensor()) return ctx.to_neuron(value.toTensor());
  if (!value.isList()) return value;
  auto list = value.toList();
  c10::impl::GenericList out(list.elementType());
  out.reserve(list.size());
  for (const c10::IValue& element : list) out.push_back(results_to_neuron(ctx, element));
  return out;
}

}  // namespace

const c10::IValue* arguments_left(const torch::jit::Stack& stack, size_t begin, size_t num_args) {
  return stack.size() == begin + num_args ? stack.data() + begin : nullptr;
}

void neuron_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t num_args = arguments.size();
  const size_t begin = stack->size() - num_args;
  CallContext ctx(schema.name().c_str());
  ctx.set_overload_name(&schema.overload_name());

  bool results_stay_on_cpu = false;  // an explicit device='cpu' argument
  bool index_off_device = false;
  c10::Device indexed(c10::DeviceType::CPU);  // the first argument's device: `self`, for index lists
  // A collective's output buffers (c10d's `output*` arguments, `recv_`'s tensors) are written, never read.
  const bool collective = op_tracking_level() >= 2 && schema.name().rfind("c10d::", 0) == 0;
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = (*stack)[begin + i];
    if (C10_UNLIKELY(collective)) {
      const auto& name = arguments[i].name();
      ctx.set_observe_arguments(name.rfind("output", 0) != 0 && schema.name() != "c10d::recv_" &&
                                schema.name() != "c10d::recv_any_source_");
    }
    if (v.isTensor()) {
      if (i == 0 && v.toTensor().defined()) indexed = v.toTensor().device();  // `self` of index ops
      v = ctx.alias(v.toTensor());
    } else if (v.isList()) {
      index_off_device = index_off_device || has_index_off_device(arguments[i], v, indexed);
      v = alias_list(ctx, v);
    } else if (v.isDevice()) {
      const auto device = v.toDevice();
      if (device.type() == kNeuron) {
        ctx.set_output_device(device.index());
        v = c10::Device(c10::DeviceType::CPU);
      } else if (device.is_cpu()) {
        results_stay_on_cpu = true;
      }
    } else if (v.isGenerator()) {
      const auto& generator = v.toGenerator();
      if (generator.device().type() == kNeuron) v = inner_cpu_generator(generator);
    } else if (v.isStorage()) {
      const auto storage = v.toStorage();
      if (storage.device_type() == kNeuron) v = ctx.alias_storage(storage);
    }
  }
  if (C10_UNLIKELY(collective)) ctx.set_observe_arguments(false);  // its results are those buffers too
  // PyTorch's message for CUDA indices on another device than the indexed tensor (or a CPU one).
  TORCH_CHECK(!index_off_device, "indices should be either on cpu or on the same device as the indexed tensor (",
              indexed.str(), ")");
  ctx.check_devices();

  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  } catch (const c10::Error& e) {
    rethrow_in_torchneuron_words(schema, arguments_left(*stack, begin, num_args), num_args, e);
    throw;
  }

  if (schema.is_mutable()) ctx.sync_mutated();  // only ops that write an argument can resize or restride it
  if (results_stay_on_cpu) return;
  const size_t num_returns = schema.returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    (*stack)[i] = results_to_neuron(ctx, (*stack)[i]);
  }
}

namespace {

// Registers the fallback as the PrivateUse1 kernel of every op of `ns` with a
// CPU kernel that `wanted` selects (once per process); returns how many.
template <void (*Kernel)(const c10::OperatorHandle&, torch::jit::Stack*) = &neuron_fallback, typename Wanted>
int64_t route_to_fallback(const char* ns, Wanted wanted) {
  auto* library = new torch::Library(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  const std::string prefix = std::string(ns) + "::";
  int64_t routed = 0;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind(prefix, 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) || !wanted(*op)) continue;
    const std::string qualified = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<Kernel>());
    ++routed;
  }
  return routed;
}

// Empties this thread's Python objects of at::ThreadLocalState for a scope, then puts them back.
class WithoutThreadLocalPythonObjects {
 public:
  WithoutThreadLocalPythonObjects() : saved_(at::impl::ThreadLocalPythonObjects::get_state()) {
    at::impl::ThreadLocalPythonObjects::set_state({});
  }
  ~WithoutThreadLocalPythonObjects() { at::impl::ThreadLocalPythonObjects::set_state(std::move(saved_)); }

 private:
  at::impl::ThreadLocalPythonObjects saved_;
};

// all_gather_into_tensor's output may be flat (numel = world x the input's), as NCCL and TorchNeuron
// take it and accelerate's gather() passes it; Gloo splits the output along dim 0 into one input
// shape per rank. Hand Gloo a view of the same bytes in that shape.
void gathered_output_as_gloo_takes_it(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (op.schema().name() != "c10d::_allgather_base_") return;
  const size_t begin = stack->size() - op.schema().arguments().size();
  c10::IValue& output = (*stack)[begin];
  const at::Tensor& input = (*stack)[begin + 1].toTensor();
  const int64_t ranks = (*stack)[begin + 2].toCustomClass<c10d::ProcessGroup>()->getSize();
  const at::Tensor& out = output.toTensor();
  std::vector<int64_t> shape{input.dim() > 0 ? ranks * input.size(0) : ranks};
  if (input.dim() > 1) shape.insert(shape.end(), input.sizes().begin() + 1, input.sizes().end());
  if (out.sizes() != c10::IntArrayRef(shape) && out.numel() == ranks * input.numel() && out.is_contiguous()) {
    output = out.view(shape);
  }
}

// A group made by init_process_group() without a backend maps only the
// accelerator (neuron) to a backend. The fallback runs collectives through the
// CPU kernels, which ask for the CPU backend: give CPU the group's neuron
// backend (Gloo), which is what serves neuron tensors anyway.
void c10d_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t begin = stack->size() - arguments.size();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& v = (*stack)[begin + i];
    if (!v.isCustomClass() || arguments[i].type()->str() != "__torch__.torch.classes.c10d.ProcessGroup") continue;
    auto group = v.toCustomClass<c10d::ProcessGroup>();
    if (!group->hasBackendForDeviceType(c10::DeviceType::CPU) && group->hasBackendForDeviceType(kNeuron)) {
      group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, group->getBackend(kNeuron));
      // torch set GLOO as the default type of a no-backend group, which has only ours:
      // without this, destroy_process_group warns "No backend of type 1 found".
      group->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
    }
  }
  gathered_output_as_gloo_takes_it(op, stack);
  // Gloo's Work keeps a copy of the caller's thread-local state, with its Python objects
  // (backward stashes a contextvars copy there). Gloo's worker thread drops the Work last,
  // possibly once the interpreter is shutting down, where taking the GIL to release them
  // ends the thread and aborts the process. A collective needs none of them.
  WithoutThreadLocalPythonObjects hidden;
  neuron_fallback(op, stack);
}

struct SilentWarnings final : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

}  // namespace

// An op with its own CPU kernel may also have a generic (composite) kernel: the
// one every structured op gets (CompositeExplicitAutogradNonFunctional), or a
// decomposition for other backends (CompositeExplicitAutograd/ImplicitAutograd).
// On neuron that generic kernel outranks a backend fallback, so neuron would run
// a decomposition (other last bits than CPU) or an empty + .out round trip
// (an extra op and dispatch on every call). Route such ops to the fallback, i.e. to
// CPU's own kernel.
int64_t route_generic_kernel_ops_to_fallback() {
  static const int64_t routed = route_to_fallback("aten", [](const c10::OperatorHandle& op) {
    return !op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) &&
           (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
            op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
            op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd));
  });
  return routed;
}

// Ops whose only kernel is generic and refuses devices it does not know (mode's
// "only supports CPU, CUDA and XPU"): on neuron, run it as on CPU, on CPU aliases.
int64_t route_ops_to_fallback(const std::vector<std::string>& names) {
  auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  for (const auto& name : names) {
    library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
  }
  return static_cast<int64_t>(names.size());
}

// torch's own c10d kernels for PrivateUse1 hand neuron tensors to the process
// group's backend for the neuron device; Gloo accepts only CPU tensors. Running
// them through the fallback gives Gloo CPU aliases of the neuron memory (no
// copies): the CPU kernel picks the group's CPU backend, and its Work keeps the
// aliases, hence the neuron storages, alive until the collective completes.
int64_t route_c10d_ops_to_fallback() {
  static const int64_t routed = [] {
    SilentWarnings silent;  // replacing a kernel warns "Overriding a previously registered kernel"
    c10::WarningUtils::WarningHandlerGuard guard(&silent);
    return route_to_fallback<&c10d_fallback>("c10d", [](const c10::OperatorHandle& op) {
      return op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
    });
  }();
  return routed;
}

namespace {

template <const char* kWhat>
void unsupported_layout(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().name(), ": ", kWhat,
                              " tensors are not supported on neuron. Keep them on the CPU, or convert them "
                              "to dense strided tensors (e.g. .to_dense()) before moving them to neuron.");
}

constexpr char kSparse[] = "sparse";
constexpr char kQuantized[] = "quantized";
constexpr char kNested[] = "nested";

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unsupported_layout<kSparse>>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unsupported_layout<kSparse>>());
}
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unsupported_layout<kQuantized>>());
}
TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unsupported_layout<kNested>>());
}

}  // namespace neuron
