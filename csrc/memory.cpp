// Host memory presented as neuron device memory, with exact per-device accounting.
//
// Every byte a neuron storage owns is counted: blocks from our allocator, and
// buffers adopted from CPU kernels (their results become neuron tensors without a copy).
#include "neuron.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sstream>
#include <mutex>
#include <pthread.h>
#include <thread>
#include <unordered_set>
#include <vector>

namespace neuron {
namespace {

[[noreturn]] void raise_out_of_memory(c10::DeviceIndex index, int64_t nbytes, const char* host_error);

// A child forked after the runtime initialized must not allocate: the real
// runtime cannot be re-initialized there. torch calls torch.neuron._lazy_init
// only once per process image, so the check lives here, where memory is counted.
std::atomic<bool> g_in_bad_fork{false};
void on_fork_child() {
  if (is_initialized()) g_in_bad_fork.store(true);
}
const int g_fork_handler = pthread_atfork(nullptr, nullptr, &on_fork_child);

void check_usable(c10::DeviceIndex index) {
  TORCH_CHECK(!g_in_bad_fork.load(std::memory_order_relaxed),
              "Cannot re-initialize the neuron runtime in a forked subprocess. To use neuron with "
              "multiprocessing, you must use the 'spawn' start method (multiprocessing.set_start_method('spawn'), "
              "or torch.multiprocessing.spawn).");
  if (C10_UNLIKELY(device_count() == 0)) check_device_index(index);  // raises why no device is visible
}

DeviceMemoryStats g_stats[kMaxDevices];

// The emulated device lives in host RAM, and Linux overcommits: a block the host cannot back is
// granted, then the OOM killer ends the process when its pages are touched. So before a large
// block, ask the kernel what it can still give (MemAvailable, capped by a cgroup v2 limit) and
// raise a clear error instead. Small blocks are not checked: the read costs microseconds.
constexpr size_t kHostCheckBytes = size_t{64} << 20;
constexpr int64_t kHostHeadroomBytes = int64_t{256} << 20;

int64_t read_first_number(const char* path, const char* key) {
  std::ifstream file(path);
  std::string word;
  while (file >> word) {
    if (key == nullptr || word == key) {
      if (key != nullptr) file >> word;
      try {
        return std::stoll(word);
      } catch (const std::exception&) {
        return -1;  // "max": no limit
      }
    }
  }
  return -1;
}

// Bytes the host can still give this process, or -1 when unknown.
int64_t host_available_bytes() {
  int64_t available = read_first_number("/proc/meminfo", "MemAvailable:");
  if (available >= 0) available *= 1024;
  const int64_t limit = read_first_number("/sys/fs/cgroup/memory.max", nullptr);
  const int64_t current = read_first_number("/sys/fs/cgroup/memory.current", nullptr);
  if (limit >= 0 && current >= 0) {
    const int64_t room = std::max<int64_t>(limit - current, 0);
    available = available < 0 ? room : std::min(available, room);
  }
  return available;
}

std::string host_shortfall(size_t nbytes);
void note_device_allocation();

// A header in front of each block keeps size and device without a second malloc.
constexpr size_t kHeaderBytes = 64;  // keeps the data 64-byte aligned, as CPU tensors are
struct BlockHeader {
  size_t nbytes;
  c10::DeviceIndex device;
};

void free_block(void* ctx) {
  auto* header = static_cast<BlockHeader*>(ctx);
  record_free(header->device, static_cast<int64_t>(header->nbytes));
  c10::free_cpu(header);
}

// A c10::DeviceAllocator, so torch.accelerator's memory API (memory_allocated,
// memory_stats, empty_cache, get_memory_info, ...) works on neuron too.
class NeuronAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const auto index = current_device();
    // Counted first: an allocation beyond the emulated capacity never touches host memory.
    record_alloc(index, static_cast<int64_t>(nbytes));
    mark_initialized();
    note_device_allocation();
    if (nbytes >= kHostCheckBytes) {
      const std::string shortfall = host_shortfall(nbytes);
      if (!shortfall.empty()) {
        record_free(index, static_cast<int64_t>(nbytes));
        raise_out_of_memory(index, static_cast<int64_t>(nbytes), shortfall.c_str());
      }
    }
    void* base = nullptr;
    try {
      base = c10::alloc_cpu(nbytes + kHeaderBytes);
    } catch (const c10::Error& error) {
      record_free(index, static_cast<int64_t>(nbytes));
      raise_out_of_memory(index, static_cast<int64_t>(nbytes), error.what_without_backtrace());
    }
    auto* header = static_cast<BlockHeader*>(base);
    header->nbytes = nbytes;
    header->device = index;
    return {static_cast<char*>(base) + kHeaderBytes, header, &free_block,
            c10::Device(kNeuron, index)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}  // nothing cached: freed memory is returned at once
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // work is done when an op returns
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_known_device(device);
    reset_accumulated_stats(device);
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    check_known_device(device);
    reset_peak_stats(device);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_known_device(device);
    const auto& s = memory_stats(device);
    const int64_t capacity = s.capacity.load();
    const int64_t used = s.bytes[kAllPool].current.load();
    return {static_cast<size_t>(std::max<int64_t>(capacity - used, 0)), static_cast<size_t>(capacity)};
  }
};

NeuronAllocator g_allocator;

// Memory produced by a CPU kernel, now owned by a neuron storage.
struct AdoptedBlock {
  c10::DataPtr data;     // either the CPU DataPtr itself...
  c10::Storage storage;  // ...or the whole CPU storage kept alive
  size_t nbytes;
  c10::DeviceIndex device;
};

void free_adopted(void* ctx) {
  auto* block = static_cast<AdoptedBlock*>(ctx);
  record_free(block->device, static_cast<int64_t>(block->nbytes));
  delete block;
}

// Pinned host memory: plain host memory whose pointers we remember, so that
// tensor.is_pinned() answers true after pin_memory().
std::mutex g_pinned_mutex;
std::unordered_set<const void*> g_pinned;

void free_pinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(ptr);
  }
  c10::free_cpu(ptr);
}

class PinnedHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = c10::alloc_cpu(std::max<size_t>(nbytes, 1));
    {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned.insert(ptr);
    }
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

PinnedHostAllocator g_pinned_allocator;

}  // namespace

DeviceMemoryStats& memory_stats(c10::DeviceIndex index) {
  return g_stats[std::clamp<int>(index, 0, kMaxDevices - 1)];
}

namespace {

std::mutex g_description_mutex;
std::string g_instance_description = "an emulated Trainium";

// Serializes the updates of one device's statistics: one atomic exchange per allocation or free
// instead of a read-modify-write per counter (a dozen). Readers load the counters without it.
struct alignas(64) StatsLock {
  std::atomic<bool> locked{false};
  void lock() {
    while (locked.exchange(true, std::memory_order_acquire)) {
      while (locked.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() { locked.store(false, std::memory_order_release); }
};
StatsLock g_stats_locks[kMaxDevices];

StatsLock& stats_lock(c10::DeviceIndex index) { return g_stats_locks[std::clamp<int>(index, 0, kMaxDevices - 1)]; }

// Only under the device's StatsLock: a plain load and store, no read-modify-write.
int64_t bump(std::atomic<int64_t>& counter, int64_t amount) {
  const int64_t now = counter.load(std::memory_order_relaxed) + amount;
  counter.store(now, std::memory_order_relaxed);
  return now;
}

void add(Stat& stat, int64_t amount) {
  const int64_t now = bump(stat.current, amount);
  if (now > stat.peak.load(std::memory_order_relaxed)) stat.peak.store(now, std::memory_order_relaxed);
  bump(stat.allocated, amount);
}

void subtract(Stat& stat, int64_t amount) {
  bump(stat.current, -amount);
  bump(stat.freed, amount);
}

StatPool pool_of(int64_t nbytes) { return nbytes < kSmallBlockLimit ? kSmallPool : kLargePool; }

// "20.00 MiB", as CUDA's out-of-memory message prints sizes.
std::string format_size(int64_t nbytes) {
  char text[64];
  if (nbytes < 1024) {
    std::snprintf(text, sizeof(text), "%lld bytes", static_cast<long long>(nbytes));
  } else {
    const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
    double value = static_cast<double>(nbytes) / 1024.0;
    int unit = 0;
    while (value >= 1024.0 && unit < 3) {
      value /= 1024.0;
      ++unit;
    }
    std::snprintf(text, sizeof(text), "%.2f %s", value, units[unit]);
  }
  return text;
}

// Empty when the host can back ``nbytes`` more; else what it lacks, for the error.
std::string host_shortfall(size_t nbytes) {
  const int64_t available = host_available_bytes();
  if (available < 0 || static_cast<int64_t>(nbytes) + kHostHeadroomBytes <= available) return {};
  return "the host has " + format_size(available) + " available and keeps " + format_size(kHostHeadroomBytes) +
         " for everything else";
}

[[noreturn]] void raise_out_of_memory(c10::DeviceIndex index, int64_t nbytes, const char* host_error) {
  auto& s = memory_stats(index);
  s.num_ooms.fetch_add(1, std::memory_order_relaxed);
  const int64_t capacity = s.capacity.load();
  const int64_t limit = s.limit.load();
  const int64_t allocated = s.bytes[kAllPool].current.load();
  std::string description;
  {
    std::lock_guard<std::mutex> lock(g_description_mutex);
    description = g_instance_description;
  }
  std::ostringstream message;
  message << "Neuron out of memory. Tried to allocate " << format_size(nbytes) << ". neuron:"
          << static_cast<int>(index) << " (logical NeuronCore " << s.core_id << " of " << description
          << ") has a total capacity of " << format_size(capacity) << " of which "
          << format_size(std::max<int64_t>(capacity - allocated, 0)) << " is free. ";
  if (limit < capacity) {
    message << "This process may use " << format_size(limit)
            << " of it (torch.neuron.set_per_process_memory_fraction). ";
  }
  message << "Of the allocated memory " << format_size(allocated) << " is allocated by PyTorch. ";
  if (host_error != nullptr) {
    message << "The host itself ran out of memory first (" << host_error
            << "): the emulated device lives in host RAM, so free host memory (other processes, CPU copies "
               "of the model), run fewer ranks on this host, or use smaller tensors.";
  } else {
    message << "Free tensors you no longer need, use a smaller batch or bfloat16, or shard the model "
               "over more NeuronCores (FSDP, tensor parallel). To emulate a device with more memory, "
               "set TORCH_NEURONX_DEVICE_MEMORY (e.g. 64GiB) before starting.";
  }
  TORCH_CHECK_WITH(OutOfMemoryError, false, message.str());
}

constexpr size_t kMovingMmapBytes = size_t{1} << 20;
// glibc's own bounds for its dynamic thresholds (64-bit), which a mallopt turns off: where a warmed-up
// process's thresholds end, so blocks under 32 MiB are reused from the heap as before.
constexpr int kSettledMmapBytes = 32 << 20;
constexpr int kSettledTrimBytes = 64 << 20;

bool malloc_tuned_by_user() {
  static const bool tuned = [] {
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    return std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr || std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr ||
           (tunables != nullptr && (std::strstr(tunables, "mmap_threshold") != nullptr ||
                                    std::strstr(tunables, "trim_threshold") != nullptr));
  }();
  return tuned;
}

// A loader: this many bytes moved from the host with no other neuron block between. A training step
// moving its batch stays under it, so its blocks keep coming from the heap, with no page to fault in.
constexpr int64_t kLoaderBytes = int64_t{64} << 20;
std::atomic<int64_t> g_moved_since_other_block{0};
std::atomic<bool> g_moving_to_device{false};
std::mutex g_moving_mutex;
thread_local bool t_moving_from_host = false;

void begin_moving_to_device() {
#if defined(__GLIBC__)
  if (g_moving_to_device.load(std::memory_order_relaxed) || malloc_tuned_by_user()) return;
  std::lock_guard<std::mutex> lock(g_moving_mutex);
  if (g_moving_to_device.load(std::memory_order_relaxed)) return;
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMovingMmapBytes));
  g_moving_to_device.store(true, std::memory_order_relaxed);
#endif
}

// Blocks taken to fill the heap's holes when a loader ends; never touched, never freed.
std::vector<void*> g_heap_hole_fillers;
constexpr size_t kSmallestFilledHole = size_t{1} << 20;

// What the model's construction and a loader freed stays in the heap as holes between live blocks, and
// glibc serves a later call's transients from them, best fit: a call wanders through the holes and faults
// each back in (docs/design.md, a loader's temporaries). So when a loader ends, the holes' pages go back to
// the host and each hole is taken by a block nobody touches: it costs address space, not memory, and a
// call's transients come from the top of the heap, as in a process that never had holes. Runs while
// glibc's threshold is still the window's: a request no hole fits is mapped and given back at once.
void fill_heap_holes() {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 33)
  malloc_trim(0);
  struct mallinfo2 before = mallinfo2();
  const size_t holes = before.fordblks - before.keepcost;  // free bytes, less the top of the heap
  size_t taken = 0;
  size_t request = holes & ~(kSmallestFilledHole - 1);
  while (request >= kSmallestFilledHole) {
    if (taken + request > holes) {  // bounded even if other threads' allocations blur what is seen
      request = (request / 2) & ~(kSmallestFilledHole - 1);
      continue;
    }
    void* block = std::malloc(request);
    const struct mallinfo2 after = mallinfo2();
    if (block != nullptr && after.arena == before.arena && after.hblks == before.hblks &&
        after.keepcost == before.keepcost) {
      g_heap_hole_fillers.push_back(block);  // from a hole: neither the top nor a mapping of its own
      taken += request;
    } else {
      std::free(block);
      request = (request / 2) & ~(kSmallestFilledHole - 1);
    }
    before = mallinfo2();  // read again: the list's own growth, or the block given back, moved it
  }
#endif
}

// Every neuron block other than a move from the host passes here: the loader is done.
void note_device_allocation() {
#if defined(__GLIBC__)
  // Every block comes here: two plain loads when nothing was moved since the last block (a store would
  // dirty the shared line each time, and the thread-local is read only when it matters).
  const bool moved = g_moved_since_other_block.load(std::memory_order_relaxed) != 0;
  if (C10_LIKELY(!moved && !g_moving_to_device.load(std::memory_order_relaxed))) return;
  if (t_moving_from_host) return;
  if (moved) g_moved_since_other_block.store(0, std::memory_order_relaxed);
  if (!g_moving_to_device.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_moving_mutex);
  if (!g_moving_to_device.load(std::memory_order_relaxed)) return;
  fill_heap_holes();
  mallopt(M_MMAP_THRESHOLD, kSettledMmapBytes);
  mallopt(M_TRIM_THRESHOLD, kSettledTrimBytes);
  g_moving_to_device.store(false, std::memory_order_relaxed);
#endif
}

}  // namespace

MovingFromHost::MovingFromHost(bool on) : was_(t_moving_from_host) { t_moving_from_host = t_moving_from_host || on; }
MovingFromHost::~MovingFromHost() { t_moving_from_host = was_; }

void note_copy_to_device(size_t nbytes) {
  const auto moved = static_cast<int64_t>(nbytes);
  if (nbytes >= kMovingMmapBytes &&
      g_moved_since_other_block.fetch_add(moved, std::memory_order_relaxed) + moved >= kLoaderBytes) {
    begin_moving_to_device();
  }
  constexpr int64_t kTrimEveryBytes = int64_t{64} << 20;
  constexpr int64_t kMinTrimIntervalNs = 1'000'000'000;  // bounds what re-faulting released pages can cost a loop
  static std::atomic<int64_t> since_trim{0};
  static std::atomic<int64_t> last_trim_ns{0};
  if (since_trim.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) + static_cast<int64_t>(nbytes) <
      kTrimEveryBytes) {
    return;
  }
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t last = last_trim_ns.load(std::memory_order_relaxed);
  if (now - last < kMinTrimIntervalNs || !last_trim_ns.compare_exchange_strong(last, now)) return;
  since_trim.store(0, std::memory_order_relaxed);
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

void record_alloc(c10::DeviceIndex index, int64_t nbytes) {
  check_usable(index);
  check_attached(index);  // under torchrun, memory only on this process's core
  if (nbytes == 0) return;  // as on CUDA, empty tensors own no device memory
  auto& s = memory_stats(index);
  {
    std::lock_guard<StatsLock> lock(stats_lock(index));
    if (C10_LIKELY(s.bytes[kAllPool].current.load(std::memory_order_relaxed) + nbytes <=
                   s.limit.load(std::memory_order_relaxed))) {
      const auto pool = pool_of(nbytes);
      add(s.bytes[kAllPool], nbytes);
      add(s.bytes[pool], nbytes);
      add(s.blocks[kAllPool], 1);
      add(s.blocks[pool], 1);
      return;
    }
  }
  raise_out_of_memory(index, nbytes, nullptr);
}

void record_free(c10::DeviceIndex index, int64_t nbytes) {
  if (nbytes == 0) return;
  auto& s = memory_stats(index);
  const auto pool = pool_of(nbytes);
  std::lock_guard<StatsLock> lock(stats_lock(index));
  subtract(s.bytes[kAllPool], nbytes);
  subtract(s.bytes[pool], nbytes);
  subtract(s.blocks[kAllPool], 1);
  subtract(s.blocks[pool], 1);
}

void reset_peak_stats(c10::DeviceIndex index) {
  auto& s = memory_stats(index);
  std::lock_guard<StatsLock> lock(stats_lock(index));
  for (Stat* group : {s.bytes, s.blocks}) {
    for (int pool = 0; pool < kNumPools; ++pool) {
      group[pool].peak.store(group[pool].current.load());
    }
  }
}

void reset_accumulated_stats(c10::DeviceIndex index) {
  auto& s = memory_stats(index);
  std::lock_guard<StatsLock> lock(stats_lock(index));
  for (Stat* group : {s.bytes, s.blocks}) {
    for (int pool = 0; pool < kNumPools; ++pool) {
      group[pool].allocated.store(0);
      group[pool].freed.store(0);
    }
  }
  s.num_ooms.store(0);
}

void set_instance_description(std::string description) {
  std::lock_guard<std::mutex> lock(g_description_mutex);
  g_instance_description = std::move(description);
}

namespace {

void copy_stats(const Stat (&from)[kNumPools], c10::CachingAllocator::StatArray& to) {
  // StatType order: AGGREGATE, SMALL_POOL, LARGE_POOL, as our pools.
  for (int pool = 0; pool < kNumPools; ++pool) {
    to[pool].current = from[pool].current.load();
    to[pool].peak = from[pool].peak.load();
    to[pool].allocated = from[pool].allocated.load();
    to[pool].freed = from[pool].freed.load();
  }
}

}  // namespace

c10::CachingDeviceAllocator::DeviceStats NeuronAllocator::getDeviceStats(c10::DeviceIndex device) {
  check_known_device(device);
  const auto& s = memory_stats(device);
  c10::CachingDeviceAllocator::DeviceStats out;
  // No cache: every block is its own segment, active and requested as allocated.
  for (auto* bytes : {&out.allocated_bytes, &out.reserved_bytes, &out.active_bytes, &out.requested_bytes}) {
    copy_stats(s.bytes, *bytes);
  }
  for (auto* blocks : {&out.allocation, &out.segment, &out.active}) copy_stats(s.blocks, *blocks);
  out.num_ooms = s.num_ooms.load();
  out.num_device_alloc = s.blocks[kAllPool].allocated.load();
  out.num_device_free = s.blocks[kAllPool].freed.load();
  out.max_split_size = -1;  // blocks are never split (CUDA reports its unlimited default as -1 too)
  return out;
}

c10::Allocator* neuron_allocator() { return &g_allocator; }

c10::DataPtr adopt_data_ptr(c10::DataPtr cpu_data, size_t nbytes, c10::DeviceIndex index) {
  void* data = cpu_data.get();
  record_alloc(index, static_cast<int64_t>(nbytes));  // may raise; cpu_data then frees the memory
  note_device_allocation();
  auto* block = new AdoptedBlock{std::move(cpu_data), c10::Storage(), nbytes, index};
  return {data, block, &free_adopted, c10::Device(kNeuron, index)};
}

c10::DataPtr adopt_storage(const c10::Storage& cpu_storage, c10::DeviceIndex index) {
  void* data = const_cast<void*>(cpu_storage.data());
  const size_t nbytes = cpu_storage.nbytes();
  record_alloc(index, static_cast<int64_t>(nbytes));
  note_device_allocation();
  auto* block = new AdoptedBlock{c10::DataPtr(), cpu_storage, nbytes, index};
  return {data, block, &free_adopted, c10::Device(kNeuron, index)};
}

c10::Allocator* pinned_host_allocator() { return &g_pinned_allocator; }

bool is_pinned_host_ptr(const void* ptr) {
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  return g_pinned.count(ptr) > 0;
}

void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes) {
  auto* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "neuron: trying to resize a storage that is not resizable");
  const auto index = impl->device().index();
  DeviceScope scope(index);  // the allocator allocates on the current device
  c10::DataPtr fresh = neuron_allocator()->allocate(new_bytes);
  const size_t keep = std::min(new_bytes, impl->nbytes());
  if (keep > 0) std::memcpy(fresh.get(), impl->data(), keep);
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(new_bytes);
}

REGISTER_ALLOCATOR(kNeuron, &g_allocator);

}  // namespace neuron
