"""Recurrent layers and cells on neuron: CPU's own route for the modules, ATen's fused cells for direct calls.

``nn.LSTM``/``nn.GRU``/``nn.RNN`` and their cells call composite ops (``aten::lstm``, ``aten::gru_cell``,
...) that choose their route by device. Neuron runs CPU's route on the same bytes (:mod:`.host_route`),
forward and backward, so every result is CPU's bit for bit, on any CPU and vector ISA.

The fused cells (``_thnn_fused_lstm_cell``, ``_thnn_fused_gru_cell`` and their backwards), which
ATen's route for other devices calls and CPU has no kernel for, keep kernels here for code that calls
them directly: written from aten ops in the order of CPU's unfused cells. Autograd differentiates
them with ``_thnn_fused_*_backward*`` (under ``create_graph`` with the composite
``_thnn_differentiable_*_backward`` instead).

The workspace is ours alone (only our backward reads it); its shape is the one ATen's meta
kernels give: the four activated LSTM gates (batch, 4*hidden); for GRU the reset, update and
new gates, the previous hidden state and the hidden-side new-gate preactivation
(batch, 5*hidden).
"""
from __future__ import annotations

import torch

from torch_neuronx.python_ops import trainium_semantics
from torch_neuronx.python_ops.host_route import host_route

_aten = torch.ops.aten
_library: torch.library.Library | None = None


def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        gates = (hidden_gates + hidden_bias) + (input_gates + input_bias)
    else:
        gates = hidden_gates + input_gates
    ingate, forgetgate, cellgate, outgate = gates.chunk(4, 1)
    ingate = ingate.sigmoid()
    forgetgate = forgetgate.sigmoid()
    cellgate = cellgate.tanh()
    outgate = outgate.sigmoid()
    cy = forgetgate * cx + ingate * cellgate
    hy = outgate * cy.tanh()
    workspace = torch.cat((ingate, forgetgate, cellgate, outgate), 1)
    return hy, cy, workspace


def _lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    ingate, forgetgate, cellgate, outgate = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    if grad_hy is None:
        grad_hy = torch.zeros_like(cy)
    grad_c = _aten.tanh_backward(grad_hy * outgate, tanh_cy)
    if grad_cy is not None:
        grad_c = grad_c + grad_cy
    grad_gates = torch.cat((
        _aten.sigmoid_backward(grad_c * cellgate, ingate),
        _aten.sigmoid_backward(grad_c * cx, forgetgate),
        _aten.tanh_backward(grad_c * ingate, cellgate),
        _aten.sigmoid_backward(grad_hy * tanh_cy, outgate),
    ), 1)
    grad_cx = grad_c * forgetgate
    # ATen returns an undefined bias gradient without bias; autograd never reads it then.
    grad_bias = grad_gates.sum(0) if has_bias else grad_gates.new_empty(0)
    return grad_gates, grad_cx, grad_bias


def _gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates = input_gates + input_bias
        hidden_gates = hidden_gates + hidden_bias
    input_r, input_z, input_n = input_gates.chunk(3, 1)
    hidden_r, hidden_z, hidden_n = hidden_gates.chunk(3, 1)
    resetgate = (hidden_r + input_r).sigmoid()
    updategate = (hidden_z + input_z).sigmoid()
    newgate = (input_n + hidden_n * resetgate).tanh()
    hy = (hx - newgate) * updategate + newgate
    workspace = torch.cat((resetgate, updategate, newgate, hx, hidden_n), 1)
    return hy, workspace


def _gru_cell_backward(grad_hy, workspace, has_bias):
    resetgate, updategate, newgate, hx, hidden_n = workspace.chunk(5, 1)
    grad_hx = grad_hy * updategate
    grad_z = _aten.sigmoid_backward(grad_hy * (hx - newgate), updategate)
    grad_n = _aten.tanh_backward(grad_hy * (1 - updategate), newgate)
    grad_r = _aten.sigmoid_backward(grad_n * hidden_n, resetgate)
    grad_input_gates = torch.cat((grad_r, grad_z, grad_n), 1)
    grad_hidden_gates = torch.cat((grad_r, grad_z, grad_n * resetgate), 1)
    if has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0), grad_hidden_gates.sum(0)
    none = grad_hy.new_empty(0)
    return grad_input_gates, grad_hidden_gates, grad_hx, none, none


# Whole layers (aten::lstm/gru/rnn_tanh/rnn_relu, padded and packed) and cells (aten::*_cell) are
# composites that pick their route by device: on CPU one input projection for all time steps and
# unfused cells (or oneDNN, CPU's default for float32/bfloat16 LSTM), elsewhere step by step through
# the fused cells above. Neuron runs CPU's route itself on the same bytes (see host_route), so its
# results are CPU's bit for bit on every machine (a double backward to rounding: tests/test_rnn.py).
_LAYERS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
_CELLS = ("lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell")
# Those whose route on Trainium runs (LSTM's and GRU's reach fused cells it has no kernel for, a
# finding): op tracking is told that route's calls, step by step (trainium_route.py).
_STEPPED = ("rnn_tanh", "rnn_relu", "rnn_tanh_cell", "rnn_relu_cell")


def _refused(op: str) -> str | None:
    cell = trainium_semantics.FUSED_CELL_OF.get(op)
    return trainium_semantics.no_cpu_kernel_error(cell) if cell else None


def install() -> None:
    """Register the kernels for neuron (once per process)."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    library.impl("_thnn_fused_lstm_cell", _lstm_cell, "PrivateUse1")
    library.impl("_thnn_fused_lstm_cell_backward_impl", _lstm_cell_backward, "PrivateUse1")
    library.impl("_thnn_fused_gru_cell", _gru_cell, "PrivateUse1")
    library.impl("_thnn_fused_gru_cell_backward", _gru_cell_backward, "PrivateUse1")
    kernels = {}
    for layer in _LAYERS:
        for overload in ("input", "data"):
            op = getattr(getattr(_aten, layer), overload)
            kernels[f"{layer}.{overload}"] = host_route(
                op, f"aten::{layer}.{overload}", cpu_arguments=(1,) if overload == "data" else (),
                refused=_refused(layer), steps_on_trainium=layer in _STEPPED)
    for cell in _CELLS:
        kernels[cell] = host_route(getattr(_aten, cell).default, f"aten::{cell}", refused=_refused(cell),
                                   steps_on_trainium=cell in _STEPPED)
    for name, kernel in kernels.items():
        # The Autograd key, so that autograd records CPU's graph; PrivateUse1 too, for calls without
        # autograd (inference mode).
        library.impl(name, kernel, "AutogradPrivateUse1")
        library.impl(name, kernel, "PrivateUse1")
    _library = library
