// Shared declarations of the torch-neuronx-cpu core.
//
// A neuron tensor is a PrivateUse1 tensor whose bytes are host memory. Every op
// runs PyTorch's own CPU kernel on a CPU *alias* of those bytes (see dispatch.h).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace neuron {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// ---- runtime.cpp: devices -------------------------------------------------
// The number of visible devices is decided in Python (topology) and set once.
c10::DeviceIndex device_count() noexcept;
void set_device_count(int64_t count);
// Under torchrun (TorchNeuron's numbering): device_count() becomes the local world size and the
// process's one core is neuron:<first>, the current device of every thread that chose none.
void bind_devices(int64_t first, int64_t count);
c10::DeviceIndex current_device() noexcept;
void set_current_device(c10::DeviceIndex index);
// With no device visible because the environment is invalid, every use of
// neuron raises this message (set by Python's topology).
void set_config_error(std::string message);
// Three checks of an index, one per use. Unbound they are the same: 0 <= index < count.
// Bound: selecting a device (set_device, guards, new tensors) takes only the process's own index
// ("Device index i is out of range. Valid range is s to s for this process"); memory on it and
// streams too ("Attempted to access device that doesn't attach to this process"); statistics and
// generators of another local rank's index are readable (nothing of this process is there).
void check_device_index(int64_t index);
void check_attached(int64_t index);
void check_known_device(int64_t index);
// -1 (or no index) means the current device; each checks as its name says.
c10::DeviceIndex resolve_device_index(c10::DeviceIndex index);
c10::DeviceIndex resolve_attached_index(c10::DeviceIndex index);
c10::DeviceIndex resolve_known_index(c10::DeviceIndex index);
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
// torch indexes at most 127 devices of a type (c10::DeviceIndex is int8).
constexpr int kMaxDevices = 128;

// Statistics are kept per pool, as torch.cuda.memory_stats does: blocks under
// 1 MiB count in the small pool, the rest in the large one.
enum StatPool { kAllPool = 0, kSmallPool = 1, kLargePool = 2, kNumPools = 3 };
constexpr int64_t kSmallBlockLimit = 1 << 20;

struct Stat {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocated{0};  // ever allocated (reset by reset_accumulated)
  std::atomic<int64_t> freed{0};
};

struct DeviceMemoryStats {
  Stat bytes[kNumPools];
  Stat blocks[kNumPools];
  std::atomic<int64_t> num_ooms{0};
  std::atomic<int64_t> capacity{INT64_MAX};  // the emulated device's memory
  std::atomic<int64_t> limit{INT64_MAX};     // capacity x set_per_process_memory_fraction
  int64_t core_id = 0;                       // the logical core this device is
};
DeviceMemoryStats& memory_stats(c10::DeviceIndex index);
// Counts an allocation; raises torch.OutOfMemoryError (counting nothing) if the
// device's limit would be exceeded.
void record_alloc(c10::DeviceIndex index, int64_t nbytes);
void record_free(c10::DeviceIndex index, int64_t nbytes);
void reset_peak_stats(c10::DeviceIndex index);
void reset_accumulated_stats(c10::DeviceIndex index);
// A host tensor was copied into a new neuron block. A loader's temporaries (a shard sliced and made
// contiguous, then moved) die around the long-lived blocks and leave free memory inside the malloc
// heap that it keeps resident: after every 64 MiB moved, at most once a second, it is returned.
void note_copy_to_device(size_t nbytes);
// While a loader moves tensors (from 64 MiB copied from the host with no other neuron block between,
// until the next neuron block that is not such a copy), host blocks of 1 MiB or more get mappings of
// their own, as glibc gives a fresh process's: a loader's temporaries are unmapped when freed instead
// of leaving holes in the heap between the blocks it keeps, which a call's activations would fault
// back in and keep. On CPU the temporaries are the weights themselves and are never freed, so glibc's
// dynamic threshold never rises; on neuron each is freed after its copy, and the first free would
// raise it. Not when the user tunes malloc (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_,
// GLIBC_TUNABLES). A move from the host holds one (on) while its block is made neuron's.
class MovingFromHost {
 public:
  explicit MovingFromHost(bool on);
  ~MovingFromHost();

 private:
  bool was_;
};
// Said in out-of-memory errors: which instance is emulated ("an emulated trn2.3xlarge (LNC=2)").
void set_instance_description(std::string description);

// The allocator for neuron storages: allocates on the current device.
c10::Allocator* neuron_allocator();
// Takes ownership of host memory produced elsewhere (a CPU kernel's result)
// and presents it as neuron memory on `index`, counted by the statistics.
c10::DataPtr adopt_data_ptr(c10::DataPtr cpu_data, size_t nbytes, c10::DeviceIndex index);
// Same, but keeps a whole CPU storage alive instead of owning its DataPtr.
c10::DataPtr adopt_storage(const c10::Storage& cpu_storage, c10::DeviceIndex index);
c10::Allocator* pinned_host_allocator();
bool is_pinned_host_ptr(const void* ptr);
// UntypedStorage.resize_(): gives the storage new memory of `new_bytes` on its own
// device, keeping the bytes both sizes share.
void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes);

// ---- streams.cpp: streams and events ---------------------------------------
// Execution is host-synchronous: work is complete when an op returns. Streams
// are ordering labels (current stream per thread and device); an event is a
// host timestamp taken when it is recorded, so it is complete at once.
c10::Stream current_stream(c10::DeviceIndex index);
c10::Stream exchange_stream(c10::Stream stream);
c10::Stream new_stream(c10::DeviceIndex index, int priority);
c10::Stream stream_from_pool(c10::DeviceIndex index, bool high_priority);
void record_event(void** event, const c10::Stream& stream, c10::DeviceIndex index, c10::EventFlag flag);
void destroy_event(void* event) noexcept;
double event_elapsed_ms(void* start, void* end);

// ---- generator.cpp: one default generator per device -----------------------
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// The CPU generator a neuron generator draws from (CPU kernels need a CPU one).
at::Generator inner_cpu_generator(const at::Generator& neuron_generator);

}  // namespace neuron
