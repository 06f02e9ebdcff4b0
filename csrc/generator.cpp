// Per-device random generators. A neuron generator is a facade over its own
// CPU generator: CPU kernels draw from that one, so the neuron stream is
// independent of the CPU stream, yet `manual_seed(s)` gives the same numbers as
// a CPU generator seeded with `s`.
#include "neuron.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <deque>
#include <mutex>

namespace neuron {
namespace {

struct NeuronGeneratorImpl final : c10::GeneratorImpl {
  explicit NeuronGeneratorImpl(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kNeuron, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)) {}

  void set_current_seed(uint64_t seed) override { cpu_.set_current_seed(seed); }
  uint64_t current_seed() const override { return cpu_.current_seed(); }
  uint64_t seed() override { return cpu_.seed(); }
  void set_offset(uint64_t offset) override { cpu_.set_offset(offset); }
  uint64_t get_offset() const override { return cpu_.get_offset(); }
  void set_state(const c10::TensorImpl& state) override { cpu_impl()->set_state(state); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override { return cpu_impl()->get_state(); }

  NeuronGeneratorImpl* clone_impl() const override {
    auto* copy = new NeuronGeneratorImpl(device().index());
    copy->cpu_ = cpu_.clone();
    return copy;
  }

  at::CPUGeneratorImpl* cpu_impl() const { return cpu_.get<at::CPUGeneratorImpl>(); }

  at::Generator cpu_;
};

std::once_flag g_defaults_once;
std::deque<at::Generator> g_defaults;  // deque: references stay valid

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  std::call_once(g_defaults_once, [] {
    for (int i = 0; i < kMaxDevices; ++i) {
      g_defaults.push_back(at::make_generator<NeuronGeneratorImpl>(static_cast<c10::DeviceIndex>(i)));
    }
  });
  const auto resolved = resolve_known_index(index);
  return g_defaults[resolved];
}

at::Generator new_generator(c10::DeviceIndex index) {
  return at::make_generator<NeuronGeneratorImpl>(resolve_known_index(index));
}

at::Generator inner_cpu_generator(const at::Generator& neuron_generator) {
  return neuron_generator.get<NeuronGeneratorImpl>()->cpu_;
}

}  // namespace neuron
