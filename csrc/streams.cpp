// Streams and events of the neuron device guard.
//
// Every op has finished when it returns (execution is host-synchronous), so
// work never waits: a stream is an ordering label with a per-thread "current"
// value, as on CUDA, and an event is a host timestamp taken when it is
// recorded. Waiting, querying and synchronizing are therefore immediate, and
// elapsed_time measures host time between the two record() calls.
#include "neuron.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <chrono>
#include <cstdlib>
#include <string>

namespace neuron {
namespace {

// Stream ids: 0 is the default stream; new streams count up per device.
std::atomic<c10::StreamId> g_next_stream_id[kMaxDevices];
thread_local c10::StreamId t_current_stream[kMaxDevices] = {};
// getStreamFromGlobalPool hands out a fixed set of ids, round robin, as CUDA's pool does.
constexpr c10::StreamId kPoolSize = 32;
constexpr c10::StreamId kPoolBase = c10::StreamId(1) << 40;  // far from ids of new streams
std::atomic<uint32_t> g_pool_cursor[kMaxDevices][2];

struct Event {
  c10::DeviceIndex device = -1;
  bool timing = false;
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
};

}  // namespace

c10::Stream current_stream(c10::DeviceIndex index) {
  index = resolve_attached_index(index);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), t_current_stream[index]);
}

c10::Stream exchange_stream(c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kNeuron, "neuron: cannot make a ", stream.device_type(),
              " stream the current neuron stream; create it with torch.neuron.Stream()");
  const auto index = resolve_attached_index(stream.device_index());
  const c10::Stream previous(c10::Stream::UNSAFE, c10::Device(kNeuron, index), t_current_stream[index]);
  t_current_stream[index] = stream.id();
  return previous;
}

// TorchNeuron's single-stream mode: unless NEURON_RT_ENABLE_HOST_CC=1, a new stream (torch.neuron.Stream(),
// the pool's) is the device's default stream. Read at each creation: a test may set it for a while.
bool multi_stream_enabled() {
  const char* value = std::getenv("NEURON_RT_ENABLE_HOST_CC");
  return value != nullptr && std::string(value) == "1";
}

c10::Stream default_stream_of(c10::DeviceIndex index) {
  return c10::Stream(c10::Stream::DEFAULT, c10::Device(kNeuron, index));
}

c10::Stream new_stream(c10::DeviceIndex index, int /*priority: no effect when execution is synchronous*/) {
  index = resolve_attached_index(index);
  if (!multi_stream_enabled()) return default_stream_of(index);
  const auto id = g_next_stream_id[index].fetch_add(1) + 1;
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), id);
}

c10::Stream stream_from_pool(c10::DeviceIndex index, bool high_priority) {
  index = resolve_attached_index(index);
  if (!multi_stream_enabled()) return default_stream_of(index);
  const auto slot = g_pool_cursor[index][high_priority ? 1 : 0].fetch_add(1) % kPoolSize;
  const auto id = kPoolBase + (high_priority ? kPoolSize : 0) + slot;
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), id);
}

void record_event(void** event, const c10::Stream& stream, c10::DeviceIndex index, c10::EventFlag flag) {
  TORCH_CHECK(index == -1 || index == stream.device_index(), "Event device index ", static_cast<int>(index),
              " does not match recording stream's device index ", static_cast<int>(stream.device_index()),
              ".");
  if (*event == nullptr) {
    auto* created = new Event();
    created->device = stream.device_index();
    created->timing = flag == c10::EventFlag::BACKEND_DEFAULT;  // torch.Event(enable_timing=True)
    *event = created;
  }
  auto* e = static_cast<Event*>(*event);
  e->recorded = true;
  e->when = std::chrono::steady_clock::now();
}

void destroy_event(void* event) noexcept {
  delete static_cast<Event*>(event);
}

double event_elapsed_ms(void* start, void* end) {
  const auto* a = static_cast<const Event*>(start);
  const auto* b = static_cast<const Event*>(end);
  // TorchNeuron's checks and words, in its order; the fix after them.
  constexpr const char* kTiming = ": create both events with torch.neuron.Event(enable_timing=True).";
  constexpr const char* kRecord = ": call record() on both events before elapsed_time().";
  // An event exists here from its first record() on (torch.neuron.Event checks the timing of one never recorded).
  TORCH_CHECK(a == nullptr || a->timing, "Event was not created with timing enabled", kTiming);
  TORCH_CHECK(b == nullptr || b->timing, "End event was not created with timing enabled", kTiming);
  TORCH_CHECK(a != nullptr && a->recorded, "Event has not been recorded", kRecord);
  TORCH_CHECK(b != nullptr && b->recorded, "End event has not been recorded", kRecord);
  TORCH_CHECK(a->device == b->device, "Events must be on the same device: this one is on neuron:",
              static_cast<int>(a->device), ", the end event on neuron:", static_cast<int>(b->device), ".");
  return std::chrono::duration<double, std::milli>(b->when - a->when).count();
}

}  // namespace neuron

// DDP's reducer times forward, backward and communication with a timer per
// device type (and warns for types without one). Host timestamps are the
// truth here, as for events.
namespace c10d {
namespace {
class NeuronTimer final : public Timer {
 public:
  explicit NeuronTimer(c10::Device) {}
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const auto from = getTimestamp(start), to = getTimestamp(end);
    if (!from || !to || *to < *from) return std::nullopt;
    return *to - *from;
  }
};
}  // namespace
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, NeuronTimer);
}  // namespace c10d
