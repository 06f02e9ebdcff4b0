// Op tracking: how often each op ran on neuron (TorchNeuron's get_executed_ops),
// and, while diagnostics are on, each call's tensors handed to Python.
#include "dispatch.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstring>
#include <exception>
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

// Ops the Python observer itself runs are not the user's.
thread_local bool t_in_observer = false;

void observe(const CallContext& ctx) {
  static const c10::OperatorHandle observer =
      c10::Dispatcher::singleton().findSchemaOrThrow("neuron::_observe_op", "");
  if (!observer.hasKernelForDispatchKey(c10::DispatchKey::CPU)) return;  // diagnostics not imported
  std::string name = ctx.op_name();
  if (ctx.overload_name() != nullptr && !ctx.overload_name()->empty()) name += "." + *ctx.overload_name();
  c10::List<at::Tensor> inputs, results;
  for (const auto& t : ctx.observed_inputs()) inputs.push_back(t);
  for (const auto& t : ctx.observed_results()) results.push_back(t);
  torch::jit::Stack stack{c10::IValue(std::move(name)), c10::IValue(inputs), c10::IValue(results)};
  t_in_observer = true;
  try {
    observer.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
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
  if (t_in_observer || std::uncaught_exceptions() > 0 || name == kCompiledGraphCall) return;
  {
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
  if (op_tracking_level() >= 2) observe(ctx);
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

void clear_op_counts() {
  std::lock_guard<std::mutex> lock(g_counts_mutex);
  g_counts.clear();
}

}  // namespace neuron
