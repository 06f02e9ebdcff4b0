// Runs a graph compiled for the host (Inductor for CPU) on neuron tensors,
// without copies: the inputs become CPU aliases, the compiled code runs on
// them, and its outputs are mapped back exactly as the eager fallback maps a
// kernel's results (aliases of inputs -> the inputs, views -> neuron views,
// fresh memory -> adopted). Python calls enter -> compiled code -> exit (or
// abort on an exception); frames nest per thread. When gradients flow, the
// same calls are autograd Functions at both ends, so one backward pass runs
// neuron autograd, the CPU graph's (AOTAutograd's compiled backward) and the
// grad accumulation without leaving C++. `_enter/_exit_compiled_call_any`
// choose between the two forms in C++, so Python makes one call at each end.
#include "dispatch.h"

#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>

namespace neuron {
namespace {

struct Frame {
  CallContext ctx{kCompiledGraphCall};
  std::vector<std::pair<at::Tensor, at::Tensor>> inputs;  // (neuron tensor, its CPU alias)
  std::vector<int64_t> alias_versions;
  bool differentiable = false;  // entered with autograd: the exit must be too
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
      // Inference tensors have no version counter (and autograd never reads one).
      frame->alias_versions.push_back(alias.is_inference() ? -1 : alias._version());
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
    if (frame->alias_versions[i] < 0) continue;
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

// The backward of a differentiable enter: the CPU aliases' gradients come back
// as the inputs' gradients, adopted as neuron tensors on the input's device
// (zero-copy). A missing gradient stays missing (no zeros). A plain Node rather
// than an autograd::Function: the forward only wires edges, with no context,
// saved values or output bookkeeping per call.
struct IntoHostGraphBackward final : torch::autograd::Node {
  explicit IntoHostGraphBackward(torch::autograd::edge_list&& next) : Node(std::move(next)) {}

  variable_list apply(variable_list&& cpu_grads) override {
    for (size_t i = 0; i < cpu_grads.size(); ++i) {
      if (devices[i] < 0 || !cpu_grads[i].defined()) continue;
      CallContext adopt(kCompiledGraphCall);
      adopt.set_output_device(devices[i]);
      cpu_grads[i] = adopt.to_neuron(cpu_grads[i]);
    }
    return std::move(cpu_grads);
  }
  std::string name() const override { return "IntoHostGraphBackward"; }

  std::vector<c10::DeviceIndex> devices;  // per input: its neuron device, -1 for a CPU input
};

// enter, differentiable: the alias of each input that requires grad gets the
// gradient edge into IntoHostGraphBackward; the others need none.
std::vector<at::Tensor> enter_differentiable(at::TensorList inputs) {
  std::vector<at::Tensor> aliases = enter(inputs);
  t_frames.back()->differentiable = true;
  auto node = c10::make_intrusive<IntoHostGraphBackward>(torch::autograd::collect_next_edges(inputs));
  if (torch::autograd::AnomalyMode::is_enabled()) node->metadata()->store_stack();
  node->devices.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    node->devices.push_back(t.defined() && t.device().type() == kNeuron ? t.device().index() : -1);
    if (t.defined() && t.requires_grad()) {
      auto* alias = aliases[i].unsafeGetTensorImpl();
      const bool edged_before = std::any_of(aliases.begin(), aliases.begin() + i,
                                            [alias](const at::Tensor& a) { return a.unsafeGetTensorImpl() == alias; });
      if (alias == t.unsafeGetTensorImpl() || edged_before) {
        // A CPU input is its own alias, and an input passed twice has one alias:
        // the edge goes on a view, never on the input (a leaf, perhaps) itself
        // nor over the other slot's edge.
        at::AutoGradMode no_grad(false);
        c10::AutoFwGradMode no_forward_grad(false);
        aliases[i] = aliases[i].view_as(aliases[i]);
      }
      const uint32_t slot = node->add_input_metadata(aliases[i]);
      torch::autograd::impl::set_gradient_edge(aliases[i], torch::autograd::Edge(node, slot));
    } else {
      node->add_input_metadata(torch::autograd::Node::undefined_input());
    }
  }
  return aliases;
}

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

std::vector<at::Tensor> exit_differentiable(at::TensorList outputs) { return OutOfHostGraph::apply(outputs); }

bool any_requires_grad(at::TensorList tensors) {
  for (const auto& t : tensors) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

// With gradients flowing into the graph (grad mode on, an input requiring
// grad), the differentiable enter; else the plain one. The exit follows the
// frame's choice.
std::vector<at::Tensor> enter_any(at::TensorList inputs) {
  if (c10::GradMode::is_enabled() && any_requires_grad(inputs)) return enter_differentiable(inputs);
  return enter(inputs);
}

std::vector<at::Tensor> exit_any(at::TensorList outputs) {
  TORCH_CHECK(!t_frames.empty(), "neuron: _exit_compiled_call without _enter_compiled_call");
  return t_frames.back()->differentiable ? exit_differentiable(outputs) : exit(outputs);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(neuron, m) {
  m.def("_enter_compiled_call(Tensor[] inputs) -> Tensor[]", &enter);
  m.def("_exit_compiled_call(Tensor[] outputs) -> Tensor[]", &exit);
  m.def("_abort_compiled_call() -> ()", &abort_call);
  m.def("_enter_compiled_call_any(Tensor[] inputs) -> Tensor[]", &enter_any);
  m.def("_exit_compiled_call_any(Tensor[] outputs) -> Tensor[]", &exit_any);
  // Whether this thread is running a compiled graph (its tensors are host aliases and host buffers).
  m.def("_inside_compiled_call() -> bool", []() { return !t_frames.empty(); });
}

}  // namespace neuron
