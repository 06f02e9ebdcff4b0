// Runs a graph compiled for the host (Inductor for CPU) on neuron tensors,
// without copies: the inputs become CPU aliases, the compiled code runs on
// them, and its outputs are mapped back exactly as the eager fallback maps a
// kernel's results (aliases of inputs -> the inputs, views -> neuron views,
// fresh memory -> adopted). Python calls enter -> compiled code -> exit (or
// abort on an exception); frames nest per thread. When gradients flow, the
// same calls are autograd Functions at both ends, so one backward pass runs
// neuron autograd, the CPU graph's (AOTAutograd's compiled backward) and the
// grad accumulation without leaving C++.
#include "dispatch.h"

#include <torch/csrc/autograd/custom_function.h>
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

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The device index of each neuron tensor, -1 for a CPU one.
std::vector<int64_t> device_indices(at::TensorList tensors) {
  std::vector<int64_t> indices;
  indices.reserve(tensors.size());
  for (const auto& t : tensors) {
    indices.push_back(t.defined() && t.device().type() == kNeuron ? t.device().index() : -1);
  }
  return indices;
}

// enter, differentiable: the CPU aliases' gradients come back as the inputs'
// gradients (adopted as neuron tensors on the input's device, zero-copy).
struct IntoHostGraph : torch::autograd::Function<IntoHostGraph> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs) {
    ctx->set_materialize_grads(false);  // an input without a gradient needs no zeros
    variable_list aliases = enter(inputs);
    variable_list no_grad;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].requires_grad()) no_grad.push_back(aliases[i]);
    }
    ctx->mark_non_differentiable(no_grad);
    ctx->saved_data["devices"] = device_indices(inputs);
    return aliases;
  }

  static variable_list backward(AutogradContext* ctx, variable_list cpu_grads) {
    const auto devices = ctx->saved_data["devices"].toIntVector();
    variable_list grads;
    grads.reserve(cpu_grads.size());
    for (size_t i = 0; i < cpu_grads.size(); ++i) {
      if (devices[i] < 0 || !cpu_grads[i].defined()) {
        grads.push_back(std::move(cpu_grads[i]));
        continue;
      }
      CallContext adopt(kCompiledGraphCall);
      adopt.set_output_device(devices[i]);
      grads.push_back(adopt.to_neuron(cpu_grads[i]));
    }
    return grads;
  }
};

// exit, differentiable: the neuron outputs' gradients enter the CPU graph as
// CPU aliases.
struct OutOfHostGraph : torch::autograd::Function<OutOfHostGraph> {
  static variable_list forward(AutogradContext* ctx, at::TensorList cpu_outputs) {
    TORCH_CHECK(!t_frames.empty(), "neuron: _exit_compiled_call without _enter_compiled_call");
    ctx->set_materialize_grads(false);  // the CPU graph's backward takes missing gradients as they are
    std::vector<c10::TensorImpl*> inputs;
    for (const auto& pair : t_frames.back()->inputs) inputs.push_back(pair.first.unsafeGetTensorImpl());
    variable_list mapped = exit(cpu_outputs);
    variable_list no_grad;
    for (size_t i = 0; i < mapped.size(); ++i) {
      if (!cpu_outputs[i].requires_grad()) {
        no_grad.push_back(mapped[i]);
      } else if (std::find(inputs.begin(), inputs.end(), mapped[i].unsafeGetTensorImpl()) != inputs.end()) {
        // The graph returned an input: a new tensor over its bytes takes the
        // gradient edge, never the input (a leaf, perhaps) itself.
        mapped[i] = make_neuron_tensor(mapped[i].storage(), mapped[i]);
      }
    }
    ctx->mark_non_differentiable(no_grad);
    return mapped;
  }

  static variable_list backward(AutogradContext*, variable_list grads) {
    CallContext aliases(kCompiledGraphCall);
    for (auto& g : grads) {
      if (g.defined()) g = aliases.alias(g, /*cpu_ok=*/true);
    }
    return grads;
  }
};

std::vector<at::Tensor> enter_differentiable(at::TensorList inputs) { return IntoHostGraph::apply(inputs); }

std::vector<at::Tensor> exit_differentiable(at::TensorList outputs) { return OutOfHostGraph::apply(outputs); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(neuron, m) {
  m.def("_enter_compiled_call(Tensor[] inputs) -> Tensor[]", &enter);
  m.def("_exit_compiled_call(Tensor[] outputs) -> Tensor[]", &exit);
  m.def("_abort_compiled_call() -> ()", &abort_call);
  m.def("_enter_compiled_call_differentiable(Tensor[] inputs) -> Tensor[]", &enter_differentiable);
  m.def("_exit_compiled_call_differentiable(Tensor[] outputs) -> Tensor[]", &exit_differentiable);
}

}  // namespace neuron
