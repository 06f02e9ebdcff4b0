// Host memory presented as neuron device memory, with exact per-device accounting.
//
// Every byte a neuron storage owns is counted: blocks from our allocator, and
// buffers adopted from CPU kernels (their results become neuron tensors without a copy).
#include "neuron.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <mutex>
#include <unordered_set>

namespace neuron {
namespace {

DeviceMemoryStats g_stats[kMaxDevices];

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

class NeuronAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const auto index = current_device();
    mark_initialized();
    void* base = c10::alloc_cpu(nbytes + kHeaderBytes);
    auto* header = static_cast<BlockHeader*>(base);
    header->nbytes = nbytes;
    header->device = index;
    record_alloc(index, static_cast<int64_t>(nbytes));
    return {static_cast<char*>(base) + kHeaderBytes, header, &free_block,
            c10::Device(kNeuron, index)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
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

void record_alloc(c10::DeviceIndex index, int64_t nbytes) {
  auto& s = memory_stats(index);
  const int64_t now = s.allocated_bytes.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  int64_t peak = s.peak_allocated_bytes.load(std::memory_order_relaxed);
  while (now > peak &&
         !s.peak_allocated_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  s.allocated_bytes_total.fetch_add(nbytes, std::memory_order_relaxed);
  s.num_allocs.fetch_add(1, std::memory_order_relaxed);
}

void record_free(c10::DeviceIndex index, int64_t nbytes) {
  auto& s = memory_stats(index);
  s.allocated_bytes.fetch_sub(nbytes, std::memory_order_relaxed);
  s.freed_bytes_total.fetch_add(nbytes, std::memory_order_relaxed);
  s.num_frees.fetch_add(1, std::memory_order_relaxed);
}

c10::Allocator* neuron_allocator() { return &g_allocator; }

c10::DataPtr adopt_data_ptr(c10::DataPtr cpu_data, size_t nbytes, c10::DeviceIndex index) {
  void* data = cpu_data.get();
  auto* block = new AdoptedBlock{std::move(cpu_data), c10::Storage(), nbytes, index};
  record_alloc(index, static_cast<int64_t>(nbytes));
  return {data, block, &free_adopted, c10::Device(kNeuron, index)};
}

c10::DataPtr adopt_storage(const c10::Storage& cpu_storage, c10::DeviceIndex index) {
  void* data = const_cast<void*>(cpu_storage.data());
  const size_t nbytes = cpu_storage.nbytes();
  auto* block = new AdoptedBlock{c10::DataPtr(), cpu_storage, nbytes, index};
  record_alloc(index, static_cast<int64_t>(nbytes));
  return {data, block, &free_adopted, c10::Device(kNeuron, index)};
}

c10::Allocator* pinned_host_allocator() { return &g_pinned_allocator; }

bool is_pinned_host_ptr(const void* ptr) {
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  return g_pinned.count(ptr) > 0;
}

REGISTER_ALLOCATOR(kNeuron, &g_allocator);

}  // namespace neuron
