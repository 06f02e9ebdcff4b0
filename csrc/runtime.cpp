// Devices, the device guard and the PrivateUse1 hooks: what makes `neuron`
// a device of torch and torch's current accelerator. Memory logic the hooks
// reach (storage resizing, pinned memory) lives in memory.cpp.
#include "neuron.h"

#include <Python.h>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <string>

#include <torch/library.h>

namespace neuron {
namespace {

std::atomic<int> g_device_count{1};
std::atomic<bool> g_initialized{false};
// TorchNeuron's numbering under torchrun (NeuronDevice.cpp): the process's one core is neuron:<LOCAL_RANK>,
// device_count() is the local world size, and only [g_first_own, g_first_own + g_own_count) is this process's.
std::atomic<int> g_first_own{0};
std::atomic<int> g_own_count{1};
std::atomic<bool> g_bound{false};
// A thread that never chose a device uses the process's: the local rank's once bound (Gloo's and
// autograd's threads too), else the first device set_device chose (TorchNeuron's global default), else 0.
std::atomic<int> g_default_device{0};
std::atomic<bool> g_default_chosen{false};
thread_local int t_current_device = -1;

// The visible cores are read from the environment when the runtime starts, as on Trainium, not at
// import: the first question about the devices asks Python's topology (runtime/core.py,
// read_topology) for them. Python's apply_topology() ends in set_device_count(), which marks them read.
enum TopologyState : int { kUnread = 0, kReading = 1, kRead = 2 };
std::atomic<int> g_topology_state{kUnread};

void read_topology() noexcept {
  int expected = kUnread;
  if (!g_topology_state.compare_exchange_strong(expected, kReading)) return;  // read, or being read
  if (Py_IsInitialized()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject* result = nullptr;
    if (PyObject* module = PyImport_ImportModule("torch_neuronx.runtime.core")) {
      result = PyObject_CallMethod(module, "read_topology", nullptr);
      Py_DECREF(module);
    }
    if (result == nullptr) PyErr_Print();  // never raised: a bad environment is recorded, not thrown
    Py_XDECREF(result);
    PyGILState_Release(gil);
  }
  g_topology_state.store(kRead);
}

std::mutex g_config_error_mutex;
std::string g_config_error;  // why no device is visible (a bad environment variable)

bool is_own(int64_t index) {
  const int first = g_first_own.load(std::memory_order_relaxed);
  return index >= first && index < first + g_own_count.load(std::memory_order_relaxed);
}

std::string own_core_fix() {
  const int first = g_first_own.load();
  return "Under torchrun each process has one NeuronCore, neuron:<LOCAL_RANK> (here neuron:" + std::to_string(first) +
         "), as on Trainium: use torch.device(\"neuron\", int(os.environ[\"LOCAL_RANK\"])), \"neuron\" or "
         "torch.neuron.current_device() instead of a fixed index.";
}

void check_count(int64_t index) {
  const int64_t count = device_count();
  if (C10_UNLIKELY(count == 0)) {
    std::lock_guard<std::mutex> lock(g_config_error_mutex);
    TORCH_CHECK(g_config_error.empty(), "neuron is unusable: ", g_config_error);
  }
  TORCH_CHECK(index >= 0 && index < count, "Device index ", index, " is out of range. Valid range is 0 to ",
              count - 1, " for this process: it sees ", count,
              " neuron device(s) (NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES choose them). Use neuron:0 to neuron:",
              count - 1, " (or 'neuron' for the current device).");
}

}  // namespace

c10::DeviceIndex device_count() noexcept {
  if (C10_UNLIKELY(g_topology_state.load(std::memory_order_acquire) == kUnread)) read_topology();
  return static_cast<c10::DeviceIndex>(g_device_count.load(std::memory_order_relaxed));
}

void set_device_count(int64_t count) {
  // c10::DeviceIndex is int8_t: 127 devices is torch's own ceiling.
  TORCH_CHECK(count >= 0 && count <= 127,
              "neuron: cannot expose ", count, " devices; torch supports at most 127 per device type");
  g_device_count.store(static_cast<int>(count));
  g_first_own.store(0);
  g_own_count.store(static_cast<int>(count));
  g_bound.store(false);
  g_default_device.store(0);
  g_default_chosen.store(false);
  g_topology_state.store(kRead);
}

void bind_devices(int64_t first, int64_t count) {
  TORCH_CHECK(count >= 1 && count <= 127 && first >= 0 && first < count, "neuron: local rank ", first,
              " is out of range for a local world size of ", count);
  g_device_count.store(static_cast<int>(count));
  g_first_own.store(static_cast<int>(first));
  g_own_count.store(1);
  g_bound.store(true);
  g_default_device.store(static_cast<int>(first));
  g_default_chosen.store(true);
  t_current_device = -1;
}

void set_config_error(std::string message) {
  std::lock_guard<std::mutex> lock(g_config_error_mutex);
  g_config_error = std::move(message);
}

void check_device_index(int64_t index) {
  if (C10_LIKELY(!g_bound.load(std::memory_order_relaxed)) || device_count() == 0) return check_count(index);
  if (C10_LIKELY(is_own(index))) return;
  const int first = g_first_own.load();
  TORCH_CHECK(false, "Device index ", index, " is out of range. Valid range is ", first, " to ",
              first + g_own_count.load() - 1, " for this process. ", own_core_fix());
}

// Bound, an index of another local rank is a device of this node, just not this process's.
void check_local_index(int64_t index) {
  const int64_t count = device_count();
  TORCH_CHECK(index >= 0 && index < count, "Device index ", index, " is out of range. Valid range is 0 to ",
              count - 1, ". ", own_core_fix());
}

void check_known_device(int64_t index) {
  if (C10_LIKELY(!g_bound.load(std::memory_order_relaxed))) return check_count(index);
  check_local_index(index);
}

void check_attached(int64_t index) {
  if (C10_LIKELY(!g_bound.load(std::memory_order_relaxed))) return check_count(index);
  if (C10_LIKELY(is_own(index))) return;
  check_local_index(index);
  const int first = g_first_own.load();
  const std::string expected = index < first ? "expected to be equal or greater than " + std::to_string(first)
                                             : "expected to be at most " + std::to_string(first + g_own_count.load() - 1);
  TORCH_CHECK(false, "Attempted to access device that doesn't attach to this process, received ", index, " ",
              expected, ". ", own_core_fix());
}

c10::DeviceIndex current_device() noexcept {
  const int chosen = t_current_device;
  return static_cast<c10::DeviceIndex>(chosen >= 0 ? chosen : g_default_device.load(std::memory_order_relaxed));
}

void set_current_device(c10::DeviceIndex index) {
  check_device_index(index);
  t_current_device = index;
}

// torch_neuronx.set_device: the thread's device, and the process's default for threads that never chose
// one if none was chosen yet (TorchNeuron's set_device: the first call in the process wins).
void select_device(c10::DeviceIndex index) {
  set_current_device(index);
  if (!g_default_chosen.exchange(true)) g_default_device.store(index);
}

c10::DeviceIndex resolve_device_index(c10::DeviceIndex index) {
  if (index < 0) return current_device();
  check_device_index(index);
  return index;
}

c10::DeviceIndex resolve_attached_index(c10::DeviceIndex index) {
  if (index < 0) return current_device();
  check_attached(index);
  return index;
}

c10::DeviceIndex resolve_known_index(c10::DeviceIndex index) {
  if (index < 0) return current_device();
  check_known_device(index);
  return index;
}

std::atomic<int> g_intraop_threads_generation{0};
namespace {
std::atomic<int> g_intraop_threads{0};
}  // namespace

void set_intraop_threads(int64_t count) {
  TORCH_CHECK(count > 0, "neuron: the number of threads must be positive, got ", count);
  g_intraop_threads.store(static_cast<int>(count));
  g_intraop_threads_generation.fetch_add(1);
}

void sync_intraop_threads_slow() {
  const int wanted = g_intraop_threads.load();
  if (wanted > 0 && at::get_num_threads() != wanted) at::set_num_threads(wanted);
}

bool is_initialized() noexcept {
  return g_initialized.load(std::memory_order_relaxed);
}

void mark_initialized() noexcept {
  g_initialized.store(true, std::memory_order_relaxed);
}

namespace {

// Streams and events are in streams.cpp; execution is host-synchronous, so
// nothing ever waits.
struct NeuronGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const auto previous = current_device();
    if (d.index() != previous) set_current_device(d.index());
    return {kNeuron, previous};
  }
  c10::Device getDevice() const override { return {kNeuron, current_device()}; }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count() && is_own(d.index())) t_current_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kNeuron, resolve_device_index(d.index())));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return stream_from_pool(d.index(), high_priority);
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return new_stream(d.index(), priority);
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return exchange_stream(s); }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex index,
              const c10::EventFlag flag) const override {
    record_event(event, stream, index, flag);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { destroy_event(event); }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    return event_elapsed_ms(start, end);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

struct NeuronHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  // Autograd asks every index for its stream: under torchrun only the process's own core has one.
  bool hasPrimaryContext(c10::DeviceIndex d) const override {
    return is_initialized() && (!g_bound.load(std::memory_order_relaxed) || is_own(d));
  }
  void init() const override { mark_initialized(); }

  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    const auto previous = current_device();
    set_current_device(d);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    return default_generator(d);
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override { return new_generator(d); }

  // Neuron memory is host memory; the pointer alone cannot tell the device.
  c10::Device getDeviceFromPtr(void*) const override { return {kNeuron, current_device()}; }

  bool isPinnedPtr(const void* data) const override { return is_pinned_host_ptr(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return pinned_host_allocator(); }

  // UntypedStorage.resize_() on a neuron storage.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    resize_storage_bytes(storage, new_bytes);
  }
};

struct HooksRegistrar {
  HooksRegistrar() { at::RegisterPrivateUse1HooksInterface(new NeuronHooks()); }
};
HooksRegistrar g_hooks_registrar;

}  // namespace
}  // namespace neuron

// `import torch_neuronx._C` finds this library (torch loads it with torch.ops.load_library, not as a module):
// TorchNeuron's compiled internals have that name, so say what is there instead of Python's "no PyInit".
PyMODINIT_FUNC PyInit__C() {
  PyErr_SetString(PyExc_ImportError,
                  "torch_neuronx._C is TorchNeuron's compiled internals, which torch-neuronx-cpu does not provide (its "
                  "core is loaded by torch, not imported). Use the public API instead: torch_neuronx.device_count(), "
                  "torch.neuron.*, torch_neuronx.memory_stats(), torch_neuronx.get_executed_ops(), ...");
  return nullptr;
}

// The device ops that belong with the state above (the rest of the table is in neuron_ops.cpp).
TORCH_LIBRARY_FRAGMENT(neuron, m) {
  m.def("_select_device(int index) -> ()", [](int64_t i) {
    neuron::check_device_index(i);
    neuron::select_device(static_cast<c10::DeviceIndex>(i));
  });
  m.def("_topology_read() -> bool", []() { return neuron::g_topology_state.load() == neuron::kRead; });
}
