// Ops TorchNeuron runs under their own name that PyTorch would decompose before a backend sees
// them: composites with no CPU kernel (linear, clone, stack, one_hot, _foreach_add, ...). TorchNeuron
// registers a neuron kernel for each (its python_ops and NeuronBindings.cpp), so its op tracking,
// its kernel cache (one NEFF per key) and its profiles name the op, not its parts. Here each runs
// PyTorch's own composite kernel (CPU's arithmetic on the same bytes; autograd as for any device)
// and is tracked and observed once, under its name; the ops inside it are not.
#include "dispatch.h"

#include <torch/library.h>

#include <mutex>
#include <string>
#include <unordered_map>

namespace neuron {
namespace {

thread_local int t_named_depth = 0;

struct Depth {
  Depth() { ++t_named_depth; }
  ~Depth() { --t_named_depth; }
};

// An argument that is, or whose list holds, a tensor wrapped_by_python.
bool behind_python(const c10::IValue& value) {
  if (value.isTensor()) return wrapped_by_python(value.toTensor());
  if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) {
      if (wrapped_by_python(t)) return true;
    }
  }
  return false;
}

// aten op `name` ('linear', 'linear_backward.out') by its overload.
c10::OperatorHandle aten_op(const std::string& name) {
  const auto dot = name.find('.');
  return c10::Dispatcher::singleton().findSchemaOrThrow(
      ("aten::" + name.substr(0, dot)).c_str(), dot == std::string::npos ? "" : name.substr(dot + 1).c_str());
}

c10::DispatchKey composite_key(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)
             ? c10::DispatchKey::CompositeImplicitAutograd
             : c10::DispatchKey::CompositeExplicitAutograd;
}

void run_named(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t begin = stack->size() - schema.arguments().size();
  for (size_t i = begin; i < stack->size(); ++i) {
    if (behind_python((*stack)[i])) {  // not a call on neuron memory: its parts reach that layer
      op.callBoxedForDispatchKey(composite_key(op), *stack);
      return;
    }
  }
  // Counted under its name when it ends (get_executed_ops); not observed: its parts are, as the plan's
  // fake tensors see them, so the report's costs and the plan's stay one model.
  CallContext ctx(schema.name().c_str());
  ctx.set_overload_name(&schema.overload_name());
  ctx.set_count_only();
  Depth inside;
  try {
    op.callBoxedForDispatchKey(composite_key(op), *stack);
  } catch (const c10::Error& e) {
    rethrow_in_torchneuron_words(schema, arguments_left(*stack, begin, schema.arguments().size()),
                                 schema.arguments().size(), e);
    throw;
  }
}

}  // namespace

bool inside_named_op() { return t_named_depth > 0; }

NamedCall::NamedCall(const char* op_name) : ctx_(std::make_unique<CallContext>(op_name)) {
  ctx_->set_count_only();
  ++t_named_depth;
}

NamedCall::~NamedCall() {
  --t_named_depth;  // first: the call itself is counted when its context ends
  ctx_.reset();
}

bool fake_or_functional(const at::Tensor& t) {
  return (t.has_storage() && t.storage().device().is_meta()) || t.key_set().has(c10::DispatchKey::Functionalize);
}

bool wrapped_by_python(const at::Tensor& t) {
  return t.defined() &&
         t.key_set().has_any(c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::Functionalize}));
}

// Calls of aten op `name` ('batch_norm_stats', 'linear_backward.out'), tracked as if its kernel were
// ours: the ops registered from Python (python_ops) run on CPU aliases, which nothing tracks. Given its
// neuron tensors, the call is also observed (diagnostics check it for findings); else only counted.
void track_op(const std::string& name, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& results,
              int64_t calls) {
  // Looked up once per name: the kernels that call this run once per layer or batch-norm call.
  static std::mutex mutex;
  static std::unordered_map<std::string, c10::OperatorHandle> ops;
  const c10::FunctionSchema* found = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = ops.find(name);
    if (it == ops.end()) it = ops.emplace(name, aten_op(name)).first;
    found = &it->second.schema();
  }
  const auto& schema = *found;  // lives as long as the op: the name's pointer is stable
  for (int64_t call = 0; call < calls; ++call) {
    CallContext ctx(schema.name().c_str());
    ctx.set_overload_name(&schema.overload_name());
    if (inputs.empty() && results.empty()) {
      ctx.set_count_only();
      continue;
    }
    for (const at::Tensor& t : inputs) ctx.observe_input(t);
    for (const at::Tensor& t : results) ctx.observe_result(t);
  }
}

// Registers run_named as the neuron kernel of `names` (below autograd); of the
// CompositeImplicitAutograd ones also above it, where their decomposition runs.
int64_t register_named_ops(const std::vector<std::string>& names) {
  auto* below = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto* above =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
  for (const auto& name : names) {
    const auto op = aten_op(name);
    below->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&run_named>());
    if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
      above->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&run_named>());
    }
  }
  return static_cast<int64_t>(names.size());
}

}  // namespace neuron
