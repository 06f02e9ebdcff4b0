// Devices, the device guard and the PrivateUse1 hooks: what makes `neuron`
// a device of torch and torch's current accelerator. Memory logic the hooks
// reach (storage resizing, pinned memory) lives in memory.cpp.
#include "neuron.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <string>

namespace neuron {
namespace {

std::atomic<int> g_device_count{1};
std::atomic<bool> g_initialized{false};
thread_local c10::DeviceIndex t_current_device = 0;

}  // namespace

c10::DeviceIndex device_count() noexcept {
  return static_cast<c10::DeviceIndex>(g_device_count.load(std::memory_order_relaxed));
}

void set_device_count(int64_t count) {
  // c10::DeviceIndex is int8_t: 127 devices is torch's own ceiling.
  TORCH_CHECK(count >= 0 && count <= 127,
              "neuron: cannot expose ", count, " devices; torch supports at most 127 per device type");
  g_device_count.store(static_cast<int>(count));
}

namespace {
std::mutex g_config_error_mutex;
std::string g_config_error;  // why no device is visible (a bad environment variable)
}  // namespace

void set_config_error(std::string message) {
  std::lock_guard<std::mutex> lock(g_config_error_mutex);
  g_config_error = std::move(message);
}

void check_device_index(int64_t index) {
  const int64_t count = device_count();
  if (C10_UNLIKELY(count == 0)) {
    std::lock_guard<std::mutex> lock(g_config_error_mutex);
    TORCH_CHECK(g_config_error.empty(), "neuron is unusable: ", g_config_error);
  }
  TORCH_CHECK(index >= 0 && index < count, "Invalid device index neuron:", index, ": ", count,
              " neuron device(s) are visible, so valid indices are 0 to ", count - 1,
              ". Use a device in that range (or 'neuron' for the current device).");
}

c10::DeviceIndex current_device() noexcept {
  return t_current_device;
}

void set_current_device(c10::DeviceIndex index) {
  check_device_index(index);
  t_current_device = index;
}

c10::DeviceIndex resolve_device_index(c10::DeviceIndex index) {
  if (index < 0) return t_current_device;
  check_device_index(index);
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
    const auto previous = t_current_device;
    if (d.index() != previous) set_current_device(d.index());
    return {kNeuron, previous};
  }
  c10::Device getDevice() const override { return {kNeuron, t_current_device}; }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) t_current_device = d.index();
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
  bool hasPrimaryContext(c10::DeviceIndex) const override { return is_initialized(); }
  void init() const override { mark_initialized(); }

  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return t_current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    const auto previous = t_current_device;
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
  c10::Device getDeviceFromPtr(void*) const override { return {kNeuron, t_current_device}; }

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
