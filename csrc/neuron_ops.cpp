// The core's Python surface, as `torch.ops.neuron.*` (no pybind: the core
// links only against libtorch, and these are not hot paths), grouped by area.
#include "dispatch.h"

#include <torch/library.h>

namespace neuron {
namespace {

// Statistics, capacities and generators: any device of this node (another local rank's reads empty).
c10::DeviceIndex checked_index(int64_t index) {
  check_known_device(index);
  return static_cast<c10::DeviceIndex>(index);
}

// Flat: for bytes then blocks, for pools all/small/large: current, peak,
// allocated, freed (24 values); then num_ooms, capacity, limit.
std::vector<int64_t> memory_stats_of(int64_t index) {
  const auto& s = memory_stats(checked_index(index));
  std::vector<int64_t> out;
  out.reserve(2 * kNumPools * 4 + 3);
  for (const Stat* group : {s.bytes, s.blocks}) {
    for (int pool = 0; pool < kNumPools; ++pool) {
      const Stat& stat = group[pool];
      out.insert(out.end(), {stat.current.load(), stat.peak.load(), stat.allocated.load(), stat.freed.load()});
    }
  }
  out.insert(out.end(), {s.num_ooms.load(), s.capacity.load(), s.limit.load()});
  return out;
}

void set_device_memory(int64_t index, int64_t capacity, int64_t core_id) {
  TORCH_CHECK(capacity > 0, "neuron: device memory must be positive, got ", capacity);
  auto& s = memory_stats(checked_index(index));
  s.capacity.store(capacity);
  s.limit.store(capacity);
  s.core_id = core_id;
}

void set_memory_limit(int64_t index, int64_t limit) {
  TORCH_CHECK(limit >= 0, "neuron: the memory limit must not be negative, got ", limit);
  memory_stats(checked_index(index)).limit.store(limit);
}

// A CPU tensor over a neuron tensor's bytes, for DLPack (neuron memory is host
// memory). Its storage holds a reference on the neuron storage, so an exported
// capsule keeps the bytes alive after the neuron tensor is gone.
at::Tensor host_alias(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kNeuron, "neuron::_host_alias expects a neuron tensor, got ", t.device());
  auto* impl = t.storage().unsafeGetStorageImpl();
  c10::DataPtr data = host_alias_data(impl);
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), impl->nbytes(),
                                                             std::move(data), nullptr, /*resizable=*/false));
  auto alias = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                        t.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return alias;
}

}  // namespace

TORCH_LIBRARY(neuron, m) {
  // Devices and runtime state (Python's topology sets them at import).
  m.def("_set_device_count(int count) -> ()", [](int64_t n) { set_device_count(n); });
  m.def("_device_count() -> int", []() -> int64_t { return device_count(); });
  m.def("_current_device() -> int", []() -> int64_t { return current_device(); });
  m.def("_set_device(int index) -> ()", [](int64_t i) {
    check_device_index(i);
    set_current_device(static_cast<c10::DeviceIndex>(i));
  });
  m.def("_check_device_index(int index) -> ()", [](int64_t i) { check_device_index(i); });
  m.def("_check_attached(int index) -> ()", [](int64_t i) { check_attached(i); });
  m.def("_check_known_device(int index) -> ()", [](int64_t i) { check_known_device(i); });
  m.def("_bind_devices(int first, int count) -> ()", [](int64_t first, int64_t n) { bind_devices(first, n); });
  m.def("_set_config_error(str message) -> ()", [](std::string m) { set_config_error(std::move(m)); });
  m.def("_is_initialized() -> bool", []() { return is_initialized(); });
  m.def("_mark_initialized() -> ()", []() { mark_initialized(); });
  m.def("_set_intraop_threads(int count) -> ()", [](int64_t n) { set_intraop_threads(n); });

  // Memory: each device's emulated capacity, limit and statistics.
  m.def("_set_device_memory(int index, int capacity, int core_id) -> ()", &set_device_memory);
  m.def("_set_memory_limit(int index, int limit) -> ()", &set_memory_limit);
  m.def("_set_instance_description(str description) -> ()",
        [](std::string d) { set_instance_description(std::move(d)); });
  m.def("_memory_stats(int index) -> int[]", &memory_stats_of);
  m.def("_reset_peak_memory_stats(int index) -> ()", [](int64_t i) { reset_peak_stats(checked_index(i)); });
  m.def("_reset_accumulated_memory_stats(int index) -> ()",
        [](int64_t i) { reset_accumulated_stats(checked_index(i)); });

  // Random numbers: each device's default generator.
  m.def("_default_generator(int index) -> Generator?", [](int64_t i) {
    return default_generator(checked_index(i));
  });

  // Streams and events.
  // torch.Event.elapsed_time rejects subclasses such as torch.neuron.Event: take the raw events.
  m.def("_event_elapsed_ms(int start, int end) -> float", [](int64_t start, int64_t end) {
    return event_elapsed_ms(reinterpret_cast<void*>(start), reinterpret_cast<void*>(end));
  });

  // Fallback routing: ops that must run CPU's own kernel through the boxed fallback.
  m.def("_route_generic_kernel_ops_to_fallback() -> int", []() { return route_generic_kernel_ops_to_fallback(); });
  m.def("_route_c10d_ops_to_fallback() -> int", []() { return route_c10d_ops_to_fallback(); });
  m.def("_route_ops_to_fallback(str[] names) -> int", &route_ops_to_fallback);
  m.def("_register_named_ops(str[] names) -> int", &register_named_ops);
  m.def("_track_op(str name, Tensor[] inputs, Tensor[] results, int calls=1) -> ()",
        [](std::string name, std::vector<at::Tensor> inputs, std::vector<at::Tensor> results, int64_t calls) {
          track_op(name, inputs, results, calls);
        });

  // Op tracking (torch_neuronx.get_executed_ops and diagnostics).
  m.def("_set_op_tracking_level(int level) -> ()", &set_op_tracking_level);
  m.def("_op_tracking_level() -> int", []() -> int64_t { return op_tracking_level(); });
  m.def("_op_counts() -> (str[], int[])", &op_counts);
  m.def("_clear_op_counts() -> ()", &clear_op_counts);
  m.def("_allocated_since_clear() -> bool", &allocated_since_clear);
  // The diagnostics observer's ops (_observe_op, _observer_*) are defined in op_tracking.cpp.

  // DLPack: a CPU tensor over a neuron tensor's bytes.
  m.def("_host_alias(Tensor t) -> Tensor", &host_alias);

  // Compiled calls (_enter/_exit/_abort_compiled_call) are defined in compiled_calls.cpp,
  // beside the per-thread frames they manage.
}

}  // namespace neuron
