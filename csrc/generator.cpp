// Per-device random generators, as TorchNeuron's. A neuron generator's state is 16 bytes, a
// Philox seed and offset (get_rng_state), and a random op on neuron with no generator draws
// from CPU's default generator, as TorchNeuron's CPU fallback does: after torch.manual_seed(s),
// a neuron draw equals the CPU draw at the same place of the CPU stream. A neuron generator
// passed explicitly draws from a CPU generator of its own, seeded with its seed.
#include "neuron.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <c10/core/TensorImpl.h>

#include <cstring>
#include <deque>
#include <mutex>

namespace neuron {
namespace {

constexpr int64_t kStateBytes = 16;  // seed, then offset: little-endian uint64 each

struct NeuronGeneratorImpl final : c10::GeneratorImpl {
  explicit NeuronGeneratorImpl(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kNeuron, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
    cpu_.set_current_seed(seed);
  }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    const uint64_t random = c10::detail::getNonDeterministicRandom();
    set_current_seed(random);
    return random;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }

  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && state.numel() == kStateBytes,
                "RNG state must be a torch.ByteTensor of ", kStateBytes,
                " bytes (a neuron generator's Philox seed and offset), got ", state.numel(), " elements of ",
                state.dtype().name(), ". Pass a state from torch.neuron.get_rng_state().");
    uint64_t seed = 0, offset = 0;
    const auto* bytes = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed, bytes, sizeof(seed));
    std::memcpy(&offset, bytes + sizeof(seed), sizeof(offset));
    set_current_seed(seed);
    offset_ = offset;
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    // Not at::empty: under a Python mode (FakeTensorMode, LocalTensorMode) that would be a tensor
    // without data. CPU's generator builds its state the same way.
    auto state = at::detail::empty_cpu({kStateBytes}, at::kByte, std::nullopt, std::nullopt, std::nullopt,
                                       std::nullopt);
    auto* bytes = state.data_ptr<uint8_t>();
    std::memcpy(bytes, &seed_, sizeof(seed_));
    std::memcpy(bytes + sizeof(seed_), &offset_, sizeof(offset_));
    return state.unsafeReleaseIntrusivePtr();
  }

  NeuronGeneratorImpl* clone_impl() const override {
    auto* copy = new NeuronGeneratorImpl(device().index());
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    copy->cpu_ = cpu_.clone();
    return copy;
  }

  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;
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
