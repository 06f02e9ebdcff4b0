// The core's Python surface, as `torch.ops.neuron.*` (no pybind: the core
// links only against libtorch, and these are not hot paths).
#include "dispatch.h"

#include <torch/library.h>

namespace neuron {
namespace {

std::vector<int64_t> memory_stats_of(int64_t index) {
  check_device_index(index);
  auto& s = memory_stats(static_cast<c10::DeviceIndex>(index));
  return {s.allocated_bytes.load(), s.peak_allocated_bytes.load(), s.allocated_bytes_total.load(),
          s.freed_bytes_total.load(), s.num_allocs.load(), s.num_frees.load()};
}

void reset_peak_memory_stats(int64_t index) {
  check_device_index(index);
  auto& s = memory_stats(static_cast<c10::DeviceIndex>(index));
  s.peak_allocated_bytes.store(s.allocated_bytes.load());
}

}  // namespace

TORCH_LIBRARY(neuron, m) {
  m.def("_set_device_count(int count) -> ()", [](int64_t n) { set_device_count(n); });
  m.def("_device_count() -> int", []() -> int64_t { return device_count(); });
  m.def("_current_device() -> int", []() -> int64_t { return current_device(); });
  m.def("_set_device(int index) -> ()", [](int64_t i) {
    check_device_index(i);
    set_current_device(static_cast<c10::DeviceIndex>(i));
  });
  m.def("_check_device_index(int index) -> ()", [](int64_t i) { check_device_index(i); });
  m.def("_is_initialized() -> bool", []() { return is_initialized(); });
  m.def("_mark_initialized() -> ()", []() { mark_initialized(); });
  m.def("_default_generator(int index) -> Generator?", [](int64_t i) {
    check_device_index(i);
    return default_generator(static_cast<c10::DeviceIndex>(i));
  });
  // [allocated, peak, allocated_total, freed_total, num_allocs, num_frees] in bytes/counts.
  m.def("_memory_stats(int index) -> int[]", &memory_stats_of);
  m.def("_set_intraop_threads(int count) -> ()", [](int64_t n) { set_intraop_threads(n); });
  m.def("_route_generic_kernel_ops_to_fallback() -> int", []() { return route_generic_kernel_ops_to_fallback(); });
  m.def("_reset_peak_memory_stats(int index) -> ()", &reset_peak_memory_stats);
}

}  // namespace neuron
