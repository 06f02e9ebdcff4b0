"""Compiled graphs in the simulator: ``torch.compile(backend="neuron")`` on fake tensors.

Nothing can be compiled for the host from fake tensors, and nothing needs to be: the plan needs
what each graph call does on Trainium, one fused NEFF. So while a rank runs, the backend hands
each Dynamo graph here (:data:`torch_neuronx.runtime.hooks.graph_simulator`). AOTAutograd splits
it as TorchNeuron's compiler would (a forward and, when it trains, a backward graph), and each
part runs its aten ops on the fake tensors inside :meth:`RankRecorder.graph_call`, which costs
them as one fused NEFF and counts one launch per call.

Attention is what TorchNeuron's compiler makes of it (:mod:`torch_neuronx.trainium.attention`).
"""
from __future__ import annotations

import contextlib

from torch_neuronx.trainium import attention
from torch_neuronx.runtime import hooks
from torch_neuronx.simulate import replay, steps

# Replay a graph's later calls with the same inputs (replay.py); a test turns it off to hold the
# replayed plan to the one every call runs for.
REPLAY = True


def _part(name: str, kind: str):
    """AOTAutograd's compiler of one part (forward, backward, inference): run its graph as it is the
    first time, and replay that call for each later one with the same inputs (replay.py)."""
    def compile_part(fx_graph, _example_inputs):
        label = name if kind != "backward" else f"{name}.backward"
        recordings = {}  # inputs' signature -> the first such call's record

        def run(args):
            active = steps.recording
            if active is None:
                return fx_graph(*args)
            key = replay.signature(args) if REPLAY else None
            if key is not None and key in recordings:
                return active.replay_graph(recordings[key], args)
            with active.graph_call(label, args) as call:
                call.outputs = fx_graph(*args)
            if key is not None:
                recordings[key] = call.recording(active.record, args)
                if recordings[key] is None:
                    del recordings[key]
            return call.outputs

        run._boxed_call = True  # AOTAutograd passes the arguments as one list
        return run

    return compile_part


def simulate_graph(gm, example_inputs, name: str):
    """What the backend returns for a Dynamo graph while a rank is simulated."""
    from torch._dynamo.backends.common import aot_autograd

    attention.as_on_trainium(gm)
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
