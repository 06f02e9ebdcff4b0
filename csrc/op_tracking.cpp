// Op tracking: how often each op ran on neuron (TorchNeuron's get_executed_ops),
// and, while diagnostics are on, each call's tensors handed to Python.
#include "dispatch.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <unordered_map>

namespace neuron {

std::atomic<int> g_op_tracking_level{1};
const char kCompiledGraphCall[] = "a neuron compiled graph";

namespace {

// Keyed by the name's address (string literals, or the dispatcher's schema
// names), so a call costs a hash of a pointer; the name is copied once, and
// compared on each hit in case a deregistered op's name memory was reused.
struct OpCount {
  std::string key;   // the name at the address, to detect reuse
  std::string name;  // with the overload: "aten::add.Tensor", as TorchNeuron reports it
  int64_t calls = 0;
};
std::mutex g_counts_mutex;
std::unordered_map<const char*, OpCount> g_counts;

// Ops the observer itself runs (its range checks, the Python detector's) are not the user's.
thread_local bool t_in_observer = false;
thread_local bool t_untracked = false;  // an UntrackedScope is on
std::atomic<bool> g_allocated{false};

// ---- level 2: diagnostics' per-call bookkeeping ------------------------------------------
// Each distinct signature (op, and each tensor argument's and result's dtype, device type and
// shape) is counted here per phase, so an ordinary call never reaches Python. Python sees a
// call only when it may make a finding: the first call of a signature (Python records its key
// and results and says which later calls need looking at), and the later calls its flags select.
constexpr int64_t kCheckEveryCall = 1;   // the op or its dtypes always make a finding
constexpr int64_t kCheckInt64Range = 2;  // int64 neuron tensors: a finding if values leave int32
constexpr int64_t kTimelineEvery = 16;   // memory is sampled every this many observed calls

struct SignatureCounts {
  int64_t flags = kCheckEveryCall;  // until Python has classified it: every call goes there
  std::vector<int64_t> calls_by_phase;
};
std::mutex g_observer_mutex;
std::unordered_map<std::string, int64_t> g_signature_index;  // encoded signature -> index
std::vector<SignatureCounts> g_signatures;
int64_t g_phase = 0;
int64_t g_observed = 0;
int64_t g_generation = 0;  // bumped by each reset, so a call that spans one leaves the new state alone
std::chrono::steady_clock::time_point g_observer_started = std::chrono::steady_clock::now();
std::vector<double> g_timeline_seconds;
std::vector<int64_t> g_timeline_bytes;

bool observed_tensor(const at::Tensor& t) {
  // A Python number passed as a tensor (x * 2) is a number to Python: not a tensor argument.
  return t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number();
}

void append_meta(std::string& key, const at::Tensor& t) {
  const auto sizes = t.sizes();
  key.push_back(static_cast<char>(t.scalar_type()));
  key.push_back(static_cast<char>(t.device().type()));
  key.push_back(static_cast<char>(sizes.size()));
  key.append(reinterpret_cast<const char*>(sizes.data()), sizes.size() * sizeof(int64_t));
}

void sample_memory_locked() {
  if (!is_initialized()) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - g_observer_started).count();
  g_timeline_seconds.push_back(seconds);
  g_timeline_bytes.push_back(memory_stats(current_device()).bytes[kAllPool].current.load());
}

// Whether an int64 neuron tensor of the call holds a value outside int32 (Trainium's int64 width).
bool int64_out_of_range(const CallContext& ctx) {
  auto outside = [](const at::Tensor& t) {
    if (t.scalar_type() != at::kLong || t.device().type() != kNeuron || t.numel() == 0) return false;
    int64_t low, high;
    if (t.is_contiguous()) {  // neuron memory is host memory, and every op has finished: read it
      const int64_t* data = t.const_data_ptr<int64_t>();
      auto [min_at, max_at] = std::minmax_element(data, data + t.numel());
      low = *min_at;
      high = *max_at;
    } else {
      auto [min_of, max_of] = at::aminmax(t);
      low = min_of.item<int64_t>();
      high = max_of.item<int64_t>();
    }
    return low < std::numeric_limits<int32_t>::min() || high > std::numeric_limits<int32_t>::max();
  };
  for (const auto& t : ctx.observed_inputs()) {
    if (observed_tensor(t) && outside(t)) return true;
  }
  for (const auto& t : ctx.observed_results()) {
    if (outside(t)) return true;
  }
  return false;
}

// Hands the call to the Python observer; `signature` is the index of a signature it has not
// seen (-1: a known one). Returns the signature's flags when it was new.
int64_t call_python(const CallContext& ctx, std::string name, int64_t signature) {
  static const c10::OperatorHandle observer =
      c10::Dispatcher::singleton().findSchemaOrThrow("neuron::_observe_op", "");
  if (!observer.hasKernelForDispatchKey(c10::DispatchKey::CPU)) return 0;  // diagnostics not imported
  c10::List<at::Tensor> inputs, results;
  for (const auto& t : ctx.observed_inputs()) inputs.push_back(t);
  for (const auto& t : ctx.observed_results()) results.push_back(t);
  torch::jit::Stack stack{c10::IValue(std::move(name)), c10::IValue(inputs), c10::IValue(results),
                          c10::IValue(signature)};
  observer.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  return stack.empty() ? 0 : stack.back().toInt();
}

void observe(const CallContext& ctx) {
  // The signature, encoded: the op's full name, then each tensor argument's and result's metadata.
  thread_local std::string key;
  key.assign(ctx.op_name());
  if (ctx.overload_name() != nullptr && !ctx.overload_name()->empty()) key.append(".").append(*ctx.overload_name());
  const size_t name_size = key.size();
  key.push_back('\0');
  for (const auto& t : ctx.observed_inputs()) {
    if (observed_tensor(t)) {
      append_meta(key, t);
      // An in-place op's (or out='s) target is one of its inputs: written non-contiguous, it fails on
      // Trainium (findings.py), so such a call is a signature of its own.
      key.push_back(t.is_contiguous() ? 'c' : 's');
    }
  }
  // The results too: non-tensor arguments (x.to(torch.float64), x.to("cpu")) change them, and
  // with them the findings (a float64 result, a copy to the host).
  key.push_back('\0');
  for (const auto& t : ctx.observed_results()) append_meta(key, t);
  int64_t index = -1;
  int64_t flags = 0;
  int64_t generation = 0;
  bool is_new = false;
  {
    std::lock_guard<std::mutex> lock(g_observer_mutex);
    auto found = g_signature_index.find(key);
    if (found == g_signature_index.end()) {
      index = static_cast<int64_t>(g_signatures.size());
      g_signature_index.emplace(key, index);
      g_signatures.emplace_back();
      is_new = true;
    } else {
      index = found->second;
    }
    generation = g_generation;
    auto& entry = g_signatures[index];
    flags = entry.flags;
    if (entry.calls_by_phase.size() <= static_cast<size_t>(g_phase)) entry.calls_by_phase.resize(g_phase + 1, 0);
    ++entry.calls_by_phase[g_phase];
    if (++g_observed % kTimelineEvery == 1) sample_memory_locked();  // the first call, then every kTimelineEvery
  }
  t_in_observer = true;
  try {
    if (is_new) {
      const int64_t classified = call_python(ctx, key.substr(0, name_size), index);
      std::lock_guard<std::mutex> lock(g_observer_mutex);
      if (generation == g_generation) g_signatures[index].flags = classified;
    } else if ((flags & kCheckEveryCall) || ((flags & kCheckInt64Range) && int64_out_of_range(ctx))) {
      call_python(ctx, key.substr(0, name_size), -1);
    }
  } catch (const std::exception& e) {
    // Diagnostics must never break the user's program: say so and go on.
    try {
      TORCH_WARN("neuron diagnostics could not observe ", ctx.op_name(), ": ", e.what());
    } catch (...) {  // warnings turned into errors: still never fail the op
    }
  }
  t_in_observer = false;
}

}  // namespace

void record_op(const CallContext& ctx) noexcept {
  const char* name = ctx.op_name();
  // The observer's own ops, a failed call, or a compiled graph's entry (its ops are not eager calls).
  if (t_in_observer || t_untracked || std::uncaught_exceptions() > 0 || name == kCompiledGraphCall) return;
  // A part of an op counted under TorchNeuron's name (named_ops.cpp) is observed, not counted.
  if (!inside_named_op()) {
    std::lock_guard<std::mutex> lock(g_counts_mutex);
    auto& entry = g_counts[name];
    if (entry.calls == 0 || entry.key != name) {
      entry.calls = 0;  // new, or a reused address: another op now
      entry.key = name;
      entry.name = name;
      if (ctx.overload_name() != nullptr && !ctx.overload_name()->empty()) entry.name += "." + *ctx.overload_name();
    }
    ++entry.calls;
  }
  if (op_tracking_level() >= 2 && !ctx.count_only()) observe(ctx);
}

void set_op_tracking_level(int64_t level) {
  TORCH_CHECK(level >= 0 && level <= 2, "neuron: op tracking level must be 0 (off), 1 (count ops) or 2 "
              "(observe calls for diagnostics), got ", level);
  g_op_tracking_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

std::tuple<std::vector<std::string>, std::vector<int64_t>> op_counts() {
  std::lock_guard<std::mutex> lock(g_counts_mutex);
  std::vector<std::string> names;
  std::vector<int64_t> calls;
  for (const auto& [ptr, entry] : g_counts) {
    if (entry.calls == 0) continue;
    names.push_back(entry.name);
    calls.push_back(entry.calls);
  }
  return {names, calls};
}

static void reset_observer() {
  std::lock_guard<std::mutex> lock(g_observer_mutex);
  g_signature_index.clear();
  g_signatures.clear();
  g_phase = 0;
  g_observed = 0;
  ++g_generation;
  g_observer_started = std::chrono::steady_clock::now();
  g_timeline_seconds.clear();
  g_timeline_bytes.clear();
}

static void set_observer_phase(int64_t phase) {
  TORCH_CHECK(phase >= 0, "neuron: an observer phase is an index >= 0, got ", phase);
  std::lock_guard<std::mutex> lock(g_observer_mutex);
  g_phase = phase;
}

static void sample_observer_memory() {
  std::lock_guard<std::mutex> lock(g_observer_mutex);
  sample_memory_locked();
}

static std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>> observer_calls() {
  std::lock_guard<std::mutex> lock(g_observer_mutex);
  std::vector<int64_t> signatures, phases, calls;
  for (size_t i = 0; i < g_signatures.size(); ++i) {
    const auto& by_phase = g_signatures[i].calls_by_phase;
    for (size_t phase = 0; phase < by_phase.size(); ++phase) {
      if (by_phase[phase] == 0) continue;
      signatures.push_back(static_cast<int64_t>(i));
      phases.push_back(static_cast<int64_t>(phase));
      calls.push_back(by_phase[phase]);
    }
  }
  return {signatures, phases, calls};
}

static std::tuple<std::vector<double>, std::vector<int64_t>> observer_timeline() {
  std::lock_guard<std::mutex> lock(g_observer_mutex);
  return {g_timeline_seconds, g_timeline_bytes};
}

void clear_op_counts() {
  std::lock_guard<std::mutex> lock(g_counts_mutex);
  g_counts.clear();
  g_allocated.store(false, std::memory_order_relaxed);
}

UntrackedScope::UntrackedScope(bool on) : was_(t_untracked) { t_untracked = t_untracked || on; }
UntrackedScope::~UntrackedScope() { t_untracked = was_; }

void count_allocation() noexcept {
  // Read first: every fresh result comes here, and a store would dirty the shared line each time.
  if (op_tracking_level() != 0 && !t_in_observer && !g_allocated.load(std::memory_order_relaxed)) {
    g_allocated.store(true, std::memory_order_relaxed);
  }
}

bool allocated_since_clear() { return g_allocated.load(std::memory_order_relaxed); }

// Diagnostics' side (torch_neuronx.diagnostics.observer).
TORCH_LIBRARY_FRAGMENT(neuron, m) {
  // Implemented in Python for the CPU key: the core calls it for the calls at tracking level 2
  // that may make a finding; `signature` >= 0 names a new signature, and the result is its flags.
  m.def("_observe_op(str op, Tensor[] inputs, Tensor[] results, int signature) -> int");
  m.def("_observer_reset() -> ()", &reset_observer);
  m.def("_observer_set_phase(int phase) -> ()", &set_observer_phase);
  m.def("_observer_sample_memory() -> ()", &sample_observer_memory);
  m.def("_observer_calls() -> (int[], int[], int[])", &observer_calls);
  m.def("_observer_timeline() -> (float[], int[])", &observer_timeline);
}

}  // namespace neuron
