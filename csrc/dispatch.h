// The zero-copy host dispatch path: run a CPU kernel on CPU aliases of neuron
// tensors, then map its results back to neuron tensors.
#pragma once

#include "neuron.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <memory>

namespace neuron {

class CallContext;

// ---- op_tracking.cpp: which ops ran (torch_neuronx.get_executed_ops) --------
// 0: off; 1: count the calls of each op (the default: a call costs only a
// pointer hash, see op_tracking.cpp);
// 2: also hand each call's tensors to the Python diagnostics
// (torch_neuronx.diagnostics), which records signatures and findings.
extern std::atomic<int> g_op_tracking_level;
inline int op_tracking_level() { return g_op_tracking_level.load(std::memory_order_relaxed); }
// Called when an op call's CallContext ends; skipped when the op threw.
void record_op(const CallContext& ctx) noexcept;
// The name of the CallContext that carries a compiled graph's inputs: not an op, not tracked.
extern const char kCompiledGraphCall[];
// While one lives on this thread, op calls are neither counted nor observed: the kernel TorchNeuron
// would not run (an index whose boolean mask selects nothing).
class UntrackedScope {
 public:
  explicit UntrackedScope(bool on);
  ~UntrackedScope();
  UntrackedScope(const UntrackedScope&) = delete;
  UntrackedScope& operator=(const UntrackedScope&) = delete;

 private:
  bool was_;
};
void set_op_tracking_level(int64_t level);
std::tuple<std::vector<std::string>, std::vector<int64_t>> op_counts();
void clear_op_counts();
// A neuron tensor got memory of its own (an op's fresh result, an empty): TorchNeuron's kernels
// allocate each one through its empty_strided kernel, which its op tracking lists.
void count_allocation() noexcept;
bool allocated_since_clear();

// named_ops.cpp: ops tracked under TorchNeuron's name while their composite runs.
int64_t register_named_ops(const std::vector<std::string>& names);
// Whether this thread is inside such an op (its parts are observed, not counted).
bool inside_named_op();
// One call of a kernel of ours that runs its op's parts on neuron tensors: counted under `op_name`
// when it ends, the parts observed, not counted (as run_named does for a composite).
class NamedCall {
 public:
  explicit NamedCall(const char* op_name);
  ~NamedCall();
  NamedCall(const NamedCall&) = delete;
  NamedCall& operator=(const NamedCall&) = delete;

 private:
  std::unique_ptr<CallContext> ctx_;
};
// A tensor that a Python layer stands in front of (a FakeTensor while Dynamo traces, a functional
// or DTensor wrapper): an autograd-level kernel sees it before that layer does.
bool wrapped_by_python(const at::Tensor& t);
// A FakeTensor (its storage is on meta) or a functional tensor: a graph is being traced through it.
bool fake_or_functional(const at::Tensor& t);
// Records `calls` calls of aten op `name` for op tracking (a python_ops kernel's call); each observed
// with the tensors given, if any.
void track_op(const std::string& name, const std::vector<at::Tensor>& inputs = {},
              const std::vector<at::Tensor>& results = {}, int64_t calls = 1);

// The boxed fallback (fallback.cpp): runs an op's CPU kernel on CPU aliases.
void neuron_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// A boxed call's arguments, if a kernel that threw left them on the stack (from `begin`), else null.
const c10::IValue* arguments_left(const torch::jit::Stack& stack, size_t begin, size_t num_args);
// Registers the fallback as the neuron kernel of ops that have a CPU kernel and
// a generic kernel that would otherwise outrank it; returns how many it routed.
int64_t route_generic_kernel_ops_to_fallback();
// Runs torch's c10d ops (collectives) for neuron tensors through the fallback, so the
// process group's CPU backend (Gloo) works on CPU aliases; returns how many it routed.
int64_t route_c10d_ops_to_fallback();
// Registers the fallback as the neuron kernel of the named aten ops (whose only
// kernel is generic and refuses unknown devices); returns how many.
int64_t route_ops_to_fallback(const std::vector<std::string>& names);

// error_words.cpp: an op's error raised again in TorchNeuron's exception type and words, when it
// has its own (returns when not); `args` are the call's arguments, if still on the stack.
void rethrow_in_torchneuron_words(const c10::FunctionSchema& schema, const c10::IValue* args, size_t num_args,
                                  const c10::Error& e);
// torch.mm's operand checks, in the words of the meta function TorchNeuron traces it through.
void check_mm_operands(const at::Tensor& a, const at::Tensor& b);

// A new neuron tensor over `storage` with the metadata (sizes, strides, offset,
// dtype, conj/neg/zero bits) of `like`.
at::Tensor make_neuron_tensor(c10::Storage storage, const at::Tensor& like);
// checkpoint_pages.cpp: a neuron tensor over the same file pages (private, copy-on-write) as `source`,
// a CPU tensor that a private mapping of a checkpoint file holds; undefined when it is not one (or is
// too small to be worth it), for the caller to copy instead.
at::Tensor map_checkpoint_pages(const at::Tensor& source, c10::DeviceIndex device);
// The DataPtr of a CPU alias of a neuron storage's bytes; it holds a reference on that storage.
c10::DataPtr host_alias_data(c10::StorageImpl* neuron_storage);
// The neuron storage whose bytes a CPU alias storage (made by host_alias_data) is over, or null.
c10::StorageImpl* aliased_neuron_storage(const c10::Storage& cpu_storage);

// One op call's worth of aliasing. Arguments sharing a storage share one alias
// storage, so CPU overlap checks and view detection see what they would on CPU.
class CallContext {
 public:
  explicit CallContext(const char* op_name) : op_name_(op_name) { sync_intraop_threads(); }
  ~CallContext() {
    if (C10_UNLIKELY(op_tracking_level() != 0)) record_op(*this);
  }
  CallContext(const CallContext&) = delete;
  CallContext& operator=(const CallContext&) = delete;

  const char* op_name() const { return op_name_; }
  // The boxed fallback's op names lack the overload; diagnostics want it.
  void set_overload_name(const std::string* overload) { overload_name_ = overload; }
  const std::string* overload_name() const { return overload_name_; }
  // Recorded only when diagnostics observe calls (level 2): every tensor
  // argument (neuron or CPU) in argument order, and the neuron results.
  const c10::SmallVector<at::Tensor, 4>& observed_inputs() const { return observed_inputs_; }
  // Arguments aliased (and results mapped) while this is off are not observed: a collective's output
  // buffers, whose values the call does not read (and has not written yet when it returns: Gloo is
  // asynchronous).
  void set_observe_arguments(bool on) { observe_arguments_ = on; }
  // Counted for op tracking, never observed (a named op: its parts are observed instead).
  void set_count_only() { count_only_ = true; }
  bool count_only() const { return count_only_; }
  const c10::SmallVector<at::Tensor, 2>& observed_results() const { return observed_results_; }

  // The CPU alias of a tensor argument (CPU tensors pass through). A CPU tensor
  // with dims beside neuron tensors is a device mismatch unless `cpu_ok`
  // (index lists, which accept CPU indices as CUDA does).
  at::Tensor alias(const at::Tensor& t, bool cpu_ok = false);
  std::optional<at::Tensor> alias(const std::optional<at::Tensor>& t) {
    return t.has_value() ? std::optional<at::Tensor>(alias(*t)) : t;
  }
  c10::Storage alias_storage(const c10::Storage& s);
  // Raise PyTorch's usual device-mismatch error if the arguments mixed devices.
  void check_devices() const;

  bool has_neuron() const { return device_ >= 0; }
  c10::DeviceIndex device() const { return device_ >= 0 ? device_ : current_device(); }
  // Where fresh results go: an explicit neuron `device=` argument, else the inputs' device.
  void set_output_device(c10::DeviceIndex d) { output_device_ = resolve_device_index(d); }
  c10::DeviceIndex output_device() const { return output_device_ >= 0 ? output_device_ : device(); }

  // A CPU result of the kernel as a neuron tensor: an aliased input maps back to
  // itself, a view of an aliased storage to a neuron view, fresh memory is adopted.
  at::Tensor to_neuron(const at::Tensor& cpu_result) {
    at::Tensor result = to_neuron_impl(cpu_result);
    if (C10_UNLIKELY(op_tracking_level() >= 2) && observe_arguments_ && result.defined()) {
      observed_results_.push_back(result);
    }
    return result;
  }
  // Propagate what the kernel did to aliased arguments (resize, set_, restride).
  void sync_mutated();
  // For kernels that run CPU's code on the neuron tensors themselves (no aliases): what
  // diagnostics observe of the call.
  void observe(std::initializer_list<const at::Tensor*> inputs, const at::Tensor& result) {
    if (C10_LIKELY(op_tracking_level() < 2)) return;
    for (const at::Tensor* t : inputs) observed_inputs_.push_back(*t);
    observed_results_.push_back(result);
  }
  void observe_input(const at::Tensor& t) {
    if (op_tracking_level() >= 2) observed_inputs_.push_back(t);
  }
  void observe_result(const at::Tensor& t) {
    if (op_tracking_level() >= 2) observed_results_.push_back(t);
  }

 private:
  at::Tensor to_neuron_impl(const at::Tensor& cpu_result);
  c10::Storage neuron_storage_for(const c10::Storage& cpu_storage);
  at::Tensor retag_fresh_result(const at::Tensor& cpu_result);

  struct StoragePair {
    c10::StorageImpl* neuron;  // kept alive by the argument tensors
    c10::Storage alias;
  };
  struct TensorPair {
    at::Tensor original;
    at::Tensor alias;
  };
  struct AdoptedPair {
    c10::StorageImpl* cpu;
    c10::Storage neuron;
  };

  const char* op_name_;
  const std::string* overload_name_ = nullptr;
  c10::DeviceIndex device_ = -1;
  c10::DeviceIndex other_neuron_device_ = -1;
  c10::DeviceIndex output_device_ = -1;
  bool saw_cpu_tensor_ = false;
  bool observe_arguments_ = true;
  bool count_only_ = false;
  c10::SmallVector<StoragePair, 4> storages_;
  c10::SmallVector<TensorPair, 4> tensors_;
  c10::SmallVector<AdoptedPair, 2> adopted_;
  c10::SmallVector<at::Tensor, 4> observed_inputs_;
  c10::SmallVector<at::Tensor, 2> observed_results_;
};

}  // namespace neuron
