// Neuron storage over a checkpoint's pages. A CPU tensor that safetensors (or torch.load(mmap=True))
// left in a private mapping of its file (torch's MapAllocator, or a slice of its storage) is moved to
// neuron by mapping the same file pages privately again, copy-on-write: no byte is copied, N processes
// on a host share one copy in the page cache, and a write copies only the page it touches. The device's accounting still charges the full bytes, as
// HBM on Trainium would hold them.
//
// Safety: the mapping is private, so writes through either tensor never reach the file or each other.
// A file replaced by a rename leaves it untouched (it maps the old inode). Before a writer of ours
// (torch.save, safetensors' savers, wrapped from Python) rewrites a mapped file in place, its blocks
// are detached: copied into anonymous memory at the same address. A truncation or in-place write by
// anything else behaves as it does for CPU's own mapping of that file.
#include "dispatch.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <ATen/MapAllocator.h>
#include <torch/library.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace neuron {
namespace {

constexpr size_t kMinBytes = size_t{1} << 20;  // below this, a copy costs less than finding the file

std::atomic<bool> g_enabled{true};

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

struct FileBlock {
  void* base;       // the page-aligned mapping
  size_t length;    // its length
  size_t nbytes;    // the tensor's bytes, as the device counts them
  dev_t dev;        // the file the pages come from
  ino_t ino;
  c10::DeviceIndex device;
};

std::mutex g_blocks_mutex;
std::unordered_set<FileBlock*> g_blocks;  // the live blocks still backed by their file (not detached)

void free_file_block(void* ctx) {
  auto* block = static_cast<FileBlock*>(ctx);
  {
    std::lock_guard<std::mutex> lock(g_blocks_mutex);
    g_blocks.erase(block);
  }
  munmap(block->base, block->length);
  record_free(block->device, static_cast<int64_t>(block->nbytes));
  delete block;
}

// The private file mapping holding [address, address + nbytes) in /proc/self/maps.
struct Mapping {
  std::string path;
  uint64_t file_offset = 0;  // of `address`
  dev_t dev = 0;
  ino_t ino = 0;
};

bool find_private_file_mapping(uintptr_t address, size_t nbytes, Mapping* out) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    char perms[5] = {0};
    unsigned long long offset = 0, inode = 0;
    unsigned major_id = 0, minor_id = 0;
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %4s %llx %x:%x %llu %n", &lo, &hi, perms, &offset, &major_id, &minor_id,
                    &inode, &path_at) < 7) {
      continue;
    }
    if (address < lo) return false;  // the lines are sorted by address
    if (address >= hi) continue;
    if (address + nbytes > hi || perms[3] != 'p' || inode == 0 || path_at <= 0) return false;
    std::string path = line.substr(static_cast<size_t>(path_at));
    if (path.empty() || path[0] != '/' || path.find(" (deleted)") != std::string::npos) return false;
    out->path = std::move(path);
    out->file_offset = offset + (address - lo);
    out->dev = makedev(major_id, minor_id);
    out->ino = static_cast<ino_t>(inode);
    return true;
  }
  return false;
}

// Whether every page of [address, address + nbytes) still holds the file's bytes: none was written
// (copied on write) or swapped out in this process, per /proc/self/pagemap.
bool pages_unmodified(uintptr_t address, size_t nbytes) {
  const size_t page = page_size();
  const uintptr_t first = address / page, last = (address + nbytes - 1) / page;
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::vector<uint64_t> entries(4096);
  bool clean = true;
  for (uintptr_t p = first; p <= last && clean;) {
    const size_t count = std::min<size_t>(entries.size(), last - p + 1);
    const ssize_t got = pread(fd, entries.data(), count * sizeof(uint64_t), static_cast<off_t>(p * sizeof(uint64_t)));
    if (got != static_cast<ssize_t>(count * sizeof(uint64_t))) {
      clean = false;
      break;
    }
    for (size_t i = 0; i < count; ++i) {
      const uint64_t e = entries[i];
      const bool present = e >> 63 & 1, swapped = e >> 62 & 1, file_page = e >> 61 & 1;
      if (swapped || (present && !file_page)) {
        clean = false;
        break;
      }
    }
    p += count;
  }
  close(fd);
  return clean;
}

// The deleter of a slice of a Python storage (UntypedStorage[a:b]), whose context is the storage it
// slices: safetensors hands each tensor such a slice of its file's mapping. Read at install.
std::atomic<c10::DeleterFnPtr> g_slice_deleter{nullptr};

// Whether torch's own file mapping (MapAllocator: UntypedStorage.from_file, torch.load(mmap=True)) holds
// this storage's bytes, directly or through slices. Any other storage is the process's own memory, copied
// without reading /proc (which would cost a small move more than the copy).
bool in_torch_file_mapping(const c10::StorageImpl* storage) {
  const c10::DeleterFnPtr slice = g_slice_deleter.load(std::memory_order_relaxed);
  for (int depth = 0; storage != nullptr && depth < 8; ++depth) {
    const c10::DataPtr& data = storage->data_ptr();
    if (at::MapAllocator::fromDataPtr(data) != nullptr) return true;
    if (slice == nullptr || data.get_deleter() != slice) return false;
    storage = static_cast<const c10::StorageImpl*>(data.get_context());
  }
  return false;
}

void first_mapping_made(const at::Tensor& source) {
  static std::once_flag once;
  std::call_once(once, [&] {
    // Python wraps the writers that could rewrite a mapped file in place (runtime/checkpoint_pages.py).
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("neuron::_checkpoint_pages_mapped", "");
    op.typed<void(const at::Tensor&)>().call(source);
  });
}

}  // namespace

at::Tensor map_checkpoint_pages(const at::Tensor& source, c10::DeviceIndex device) {
  const size_t nbytes = source.nbytes();
  if (!g_enabled.load(std::memory_order_relaxed) || nbytes < kMinBytes || !source.is_cpu() ||
      source.layout() != at::kStrided || !source.is_contiguous() || source.is_conj() || source.is_neg() ||
      source._is_zerotensor() || !source.has_storage() ||
      !in_torch_file_mapping(source.storage().unsafeGetStorageImpl())) {
    return at::Tensor();
  }
  const auto address = reinterpret_cast<uintptr_t>(source.const_data_ptr());
  Mapping mapping;
  if (!find_private_file_mapping(address, nbytes, &mapping) || !pages_unmodified(address, nbytes)) {
    return at::Tensor();
  }
  const int fd = open(mapping.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return at::Tensor();
  struct stat st {};
  const bool same_file = fstat(fd, &st) == 0 && st.st_dev == mapping.dev && st.st_ino == mapping.ino &&
                         static_cast<uint64_t>(st.st_size) >= mapping.file_offset + nbytes;
  const size_t page = page_size();
  const uint64_t aligned = mapping.file_offset / page * page;
  const size_t lead = static_cast<size_t>(mapping.file_offset - aligned);
  const size_t length = (lead + nbytes + page - 1) / page * page;
  void* base = same_file ? mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(aligned))
                         : MAP_FAILED;
  close(fd);
  if (base == MAP_FAILED) return at::Tensor();  // a renamed-over path, a vanished file, no map left: copy
  try {
    record_alloc(device, static_cast<int64_t>(nbytes));  // the device's memory, as for any tensor
  } catch (...) {
    munmap(base, length);
    throw;
  }
  mark_initialized();
  count_allocation();
  auto* block = new FileBlock{base, length, nbytes, mapping.dev, mapping.ino, device};
  {
    std::lock_guard<std::mutex> lock(g_blocks_mutex);
    g_blocks.insert(block);
  }
  c10::DataPtr data(static_cast<char*>(base) + lead, block, &free_file_block, c10::Device(kNeuron, device));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), neuron_allocator(),
                       /*resizable=*/true);
  at::Tensor result = make_neuron_tensor(std::move(storage), source.as_strided(source.sizes(), source.strides(), 0));
  first_mapping_made(source);
  return result;
}

namespace {

// Copies each block still backed by `path`'s file into anonymous memory at the same address, so a
// rewrite of the file in place (truncating it first) changes nothing a neuron tensor holds. Returns how
// many blocks it detached.
int64_t detach_checkpoint_pages(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return 0;
  std::lock_guard<std::mutex> lock(g_blocks_mutex);
  int64_t detached = 0;
  for (auto it = g_blocks.begin(); it != g_blocks.end();) {
    FileBlock* block = *it;
    if (block->dev != st.st_dev || block->ino != st.st_ino) {
      ++it;
      continue;
    }
    void* copy = mmap(nullptr, block->length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(copy != MAP_FAILED, "neuron: could not copy the pages of ", path,
                " before it is rewritten (no memory left): free some memory, or save to another path");
    std::memcpy(copy, block->base, block->length);
    void* moved = mremap(copy, block->length, block->length, MREMAP_MAYMOVE | MREMAP_FIXED, block->base);
    if (moved == MAP_FAILED) {
      munmap(copy, block->length);
      TORCH_CHECK(false, "neuron: could not detach the pages of ", path, " before it is rewritten: ",
                  std::strerror(errno), "; save to another path");
    }
    it = g_blocks.erase(it);  // anonymous memory now: the file's later bytes no longer matter
    ++detached;
  }
  return detached;
}

int64_t checkpoint_blocks() {
  std::lock_guard<std::mutex> lock(g_blocks_mutex);
  return static_cast<int64_t>(g_blocks.size());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(neuron, m) {
  m.def("_checkpoint_pages_mapped(Tensor source) -> ()");
  m.def("_detach_checkpoint_pages(str path) -> int", &detach_checkpoint_pages);
  m.def("_checkpoint_blocks() -> int", &checkpoint_blocks);
  m.def("_set_map_checkpoints(bool enabled) -> ()", [](bool enabled) { g_enabled.store(enabled); });
  m.def("_set_storage_slice_probe(Tensor probe) -> ()", [](const at::Tensor& probe) {
    g_slice_deleter.store(probe.storage().data_ptr().get_deleter());
  });
}

}  // namespace neuron
