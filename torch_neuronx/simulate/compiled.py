"""Compiled graphs in the simulator: ``torch.compile(backend="neuron")`` on fake tensors.

Nothing can be compiled for the host from fake tensors, and nothing needs to be: the plan needs
what each graph call does on Trainium, one fused NEFF. So while a rank runs, the backend hands
each Dynamo graph here (:data:`torch_neuronx.runtime.hooks.graph_simulator`). AOTAutograd splits
it as TorchNeuron's compiler would (a forward and, when it trains, a backward graph), and each
part runs its aten ops on the fake tensors inside :meth:`RankRecorder.graph_call`, which costs
them as one fused NEFF and counts one launch per call.

Attention is what TorchNeuron's compiler makes of it (:mod:`torch_neuronx.diagnostics.trainium_attention`).
"""
from __future__ import annotations

import contextlib

from torch_neuronx.diagnostics import trainium_attention
from torch_neuronx.runtime import hooks
from torch_neuronx.simulate import steps


def _part(name: str, kind: str):
    """AOTAutograd's compiler of one part (forward, backward, inference): run its graph as it is."""
    def compile_part(fx_graph, _example_inputs):
        label = name if kind != "backward" else f"{name}.backward"

        def run(args):
            active = steps.recording
            with active.graph_call(label, args) if active is not None else contextlib.nullcontext() as call:
                outputs = fx_graph(*args)
                if call is not None:
                    call.outputs = outputs
            return outputs

        run._boxed_call = True  # AOTAutograd passes the arguments as one list
        return run

    return compile_part


def simulate_graph(gm, example_inputs, name: str):
    """What the backend returns for a Dynamo graph while a rank is simulated."""
    from torch._dynamo.backends.common import aot_autograd

    trainium_attention.as_on_trainium(gm)
    backend = aot_autograd(fw_compiler=_part(name, "forward"), bw_compiler=_part(name, "backward"),
                           inference_compiler=_part(name, "inference"), keep_inference_input_mutations=True)
    return backend(gm, example_inputs)


@contextlib.contextmanager
def installed():
    """The backend simulates its graphs for the duration."""
    previous = hooks.graph_simulator
    hooks.install_graph_simulator(simulate_graph)
    try:
        yield
    finally:
        hooks.install_graph_simulator(previous)
