// Shared declarations of the torch-neuronx-cpu core.
//
// A neuron tensor is a PrivateUse1 tensor whose bytes are host memory. Every op
// runs PyTorch's own CPU kernel on a CPU *alias* of those bytes (see dispatch.h).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <cstdint>

namespace neuron {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// ---- runtime.cpp: devices -------------------------------------------------
// The number of visible devices is decided in Python (topology) and set once.
c10::DeviceIndex device_count() noexcept;
void set_device_count(int64_t count);
c10::DeviceIndex current_device() noexcept;
void set_current_device(c10::DeviceIndex index);
// Throws a RuntimeError naming the valid range unless 0 <= index < count.
void check_device_index(int64_t index);
// -1 (or no index) means the current device.
c10::DeviceIndex resolve_device_index(c10::DeviceIndex index);
bool is_initialized() noexcept;
void mark_initialized() noexcept;

// Intra-op threads. Backward of neuron tensors runs on autograd's neuron device
// thread, whose OpenMP thread count was fixed when the thread started; CPU's
// backward runs on the caller's thread. To keep neuron's numbers (reduction
// order) and speed equal to CPU's, every op syncs its thread's count with the
// one last set through torch.set_num_threads (one load and compare per op).
void set_intraop_threads(int64_t count);
void sync_intraop_threads_slow();
extern std::atomic<int> g_intraop_threads_generation;
inline void sync_intraop_threads() {
  thread_local int seen = 0;
  const int generation = g_intraop_threads_generation.load(std::memory_order_relaxed);
  if (C10_UNLIKELY(generation != seen)) {
    seen = generation;
    sync_intraop_threads_slow();
  }
}

// Sets the current device for a scope (cheaper than c10::DeviceGuard; no virtual calls).
class DeviceScope {
 public:
  explicit DeviceScope(c10::DeviceIndex index)
      : previous_(current_device()) {
    if (index != previous_) set_current_device(index);
  }
  ~DeviceScope() {
    if (current_device() != previous_) set_current_device(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};

// ---- memory.cpp: host allocator with per-device accounting ------------------
constexpr int kMaxDevices = 128;

struct DeviceMemoryStats {
  std::atomic<int64_t> allocated_bytes{0};
  std::atomic<int64_t> peak_allocated_bytes{0};
  std::atomic<int64_t> allocated_bytes_total{0};  // ever allocated
  std::atomic<int64_t> freed_bytes_total{0};
  std::atomic<int64_t> num_allocs{0};
  std::atomic<int64_t> num_frees{0};
};
DeviceMemoryStats& memory_stats(c10::DeviceIndex index);
void record_alloc(c10::DeviceIndex index, int64_t nbytes);
void record_free(c10::DeviceIndex index, int64_t nbytes);

// The allocator for neuron storages: allocates on the current device.
c10::Allocator* neuron_allocator();
// Takes ownership of host memory produced elsewhere (a CPU kernel's result)
// and presents it as neuron memory on `index`, counted by the statistics.
c10::DataPtr adopt_data_ptr(c10::DataPtr cpu_data, size_t nbytes, c10::DeviceIndex index);
// Same, but keeps a whole CPU storage alive instead of owning its DataPtr.
c10::DataPtr adopt_storage(const c10::Storage& cpu_storage, c10::DeviceIndex index);
c10::Allocator* pinned_host_allocator();
bool is_pinned_host_ptr(const void* ptr);

// ---- generator.cpp: one default generator per device -----------------------
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// The CPU generator a neuron generator draws from (CPU kernels need a CPU one).
at::Generator inner_cpu_generator(const at::Generator& neuron_generator);

}  // namespace neuron
