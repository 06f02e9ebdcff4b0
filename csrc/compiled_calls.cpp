// Runs a graph compiled for the host (Inductor for CPU) on neuron tensors,
// without copies: the inputs become CPU aliases, the compiled code runs on
// them, and its outputs are mapped back exactly as the eager fallback maps a
// kernel's results (aliases of inputs -> the inputs, views -> neuron views,
// fresh memory -> adopted). Python calls enter -> compiled code -> exit (or
// abort on an exception); frames nest per thread.
#include "dispatch.h"

#include <torch/library.h>

#include <memory>

namespace neuron {
namespace {

struct Frame {
  CallContext ctx{kCompiledGraphCall};
  std::vector<std::pair<at::Tensor, at::Tensor>> inputs;  // (neuron tensor, its CPU alias)
  std::vector<int64_t> alias_versions;
};

thread_local std::vector<std::unique_ptr<Frame>> t_frames;

std::vector<at::Tensor> enter(at::TensorList inputs) {
  auto frame = std::make_unique<Frame>();
  std::vector<at::Tensor> aliases;
  aliases.reserve(inputs.size());
  for (const auto& t : inputs) {
    at::Tensor alias = frame->ctx.alias(t, /*cpu_ok=*/true);
    if (t.defined() && t.device().type() == kNeuron) {
      frame->inputs.emplace_back(t, alias);
      frame->alias_versions.push_back(alias._version());
    }
    aliases.push_back(std::move(alias));
  }
  t_frames.push_back(std::move(frame));
  return aliases;
}

std::vector<at::Tensor> exit(at::TensorList outputs) {
  TORCH_CHECK(!t_frames.empty(), "neuron: _exit_compiled_call without _enter_compiled_call");
  std::unique_ptr<Frame> frame = std::move(t_frames.back());
  t_frames.pop_back();
  frame->ctx.sync_mutated();
  // A graph that mutated an input bumped its alias's version: autograd must see
  // the neuron tensor as modified too.
  for (size_t i = 0; i < frame->inputs.size(); ++i) {
    const auto& [original, alias] = frame->inputs[i];
    for (int64_t v = frame->alias_versions[i]; v < alias._version(); ++v) {
      original.unsafeGetTensorImpl()->bump_version();
    }
  }
  std::vector<at::Tensor> mapped;
  mapped.reserve(outputs.size());
  for (const auto& out : outputs) mapped.push_back(frame->ctx.to_neuron(out));
  return mapped;
}

void abort_call() {
  if (!t_frames.empty()) t_frames.pop_back();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(neuron, m) {
  m.def("_enter_compiled_call(Tensor[] inputs) -> Tensor[]", &enter);
  m.def("_exit_compiled_call(Tensor[] outputs) -> Tensor[]", &exit);
  m.def("_abort_compiled_call() -> ()", &abort_call);
}

}  // namespace neuron
