"""Recurrent layers and cells on neuron: ATen's fused RNN cells, and CPU's path for whole layers.

Cells (``nn.LSTMCell``, ``nn.GRUCell``) take ATen's device path for CUDA, XPU and PrivateUse1:
two matmuls, then ``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell``, whose backward autograd
computes with ``_thnn_fused_lstm_cell_backward_impl`` / ``_thnn_fused_gru_cell_backward`` (under
``create_graph`` it uses the composite ``_thnn_differentiable_*_backward`` instead). CPU has no
kernel for these four, so the fallback cannot serve them: they are written here from aten ops,
in the order of operations of CPU's own (unfused) cells, so float32 cell forwards equal CPU's.

The workspace is ours alone (only our backward reads it); its shape is the one ATen's meta
kernels give: the four activated LSTM gates (batch, 4*hidden); for GRU the reset, update and
new gates, the previous hidden state and the hidden-side new-gate preactivation
(batch, 5*hidden).

Whole layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) run CPU's generic path instead; see below.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

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


# Whole layers (aten::lstm/gru/rnn_tanh/rnn_relu, padded and packed): CPU's generic path, step for
# step. ATen picks its path by device: on CPU it projects the inputs of all time steps in one
# matmul and runs unfused cells; elsewhere it projects step by step through the fused cells, which
# rounds differently (the input weights' gradient is one matmul on CPU, a sum of per-step ones
# elsewhere). Registered at the Autograd key, autograd records the same graph as on CPU, so
# results are CPU's bit for bit (LSTM: CPU's generic path; CPU's default for float32/bfloat16
# LSTM is oneDNN, which rounds differently again).


class _Params:
    def __init__(self, w_ih, w_hh, b_ih=None, b_hh=None, w_hr=None):
        self.w_ih, self.w_hh, self.b_ih, self.b_hh, self.w_hr = w_ih, w_hh, b_ih, b_hh, w_hr


def _gather_params(params, has_biases, has_projections=False):
    step = (4 if has_biases else 2) + (1 if has_projections else 0)
    groups = [params[i:i + step] for i in range(0, len(params), step)]
    if has_biases:
        return [_Params(g[0], g[1], g[2], g[3], g[4] if has_projections else None) for g in groups]
    return [_Params(g[0], g[1], None, None, g[2] if has_projections else None) for g in groups]


def _simple_cell(nonlinearity):
    def cell(input_w, hidden, p):
        return nonlinearity(F.linear(hidden, p.w_hh, p.b_hh) + input_w)
    return cell


def _lstm_step(input_w, hidden, p):
    hx, cx = hidden
    gates = F.linear(hx, p.w_hh, p.b_hh) + input_w
    ingate, forgetgate, cellgate, outgate = gates.chunk(4, 1)
    cy = forgetgate.sigmoid() * cx + ingate.sigmoid() * cellgate.tanh()
    hy = outgate.sigmoid() * cy.tanh()
    if p.w_hr is not None:
        hy = torch.matmul(hy, p.w_hr.t())
    return hy, cy


def _gru_step(input_w, hidden, p):
    input_r, input_z, input_n = input_w.chunk(3, 1)
    hidden_r, hidden_z, hidden_n = F.linear(hidden, p.w_hh, p.b_hh).chunk(3, 1)
    resetgate = (hidden_r + input_r).sigmoid()
    updategate = (hidden_z + input_z).sigmoid()
    newgate = (input_n + hidden_n * resetgate).tanh()
    return (hidden - newgate) * updategate + newgate


def _output(hidden):
    return hidden[0] if isinstance(hidden, tuple) else hidden


def _slice(hidden, start, end):
    if isinstance(hidden, tuple):
        return tuple(h.narrow(0, start, end - start) for h in hidden)
    return hidden.narrow(0, start, end - start)


def _concat(hiddens):
    if isinstance(hiddens[0], tuple):
        return tuple(torch.cat(parts, 0) for parts in zip(*hiddens))
    return torch.cat(hiddens, 0)


def _full_layer(cell, input, hidden, p, reverse=False):
    steps = F.linear(input, p.w_ih, p.b_ih).unbind(0)
    outputs = []
    for step in (reversed(steps) if reverse else steps):
        hidden = cell(step, hidden, p)
        outputs.append(_output(hidden))
    if reverse:
        outputs.reverse()
    return torch.stack(outputs, 0), hidden


def _packed_layer(cell, data, batch_sizes, hidden, p):
    input_w = F.linear(data, p.w_ih, p.b_ih)
    outputs, finished = [], []
    offset, last = 0, batch_sizes[0]
    for batch in batch_sizes:
        step = input_w.narrow(0, offset, batch)
        offset += batch
        if batch < last:  # sequences that ended: their final hidden state is set aside
            finished.append(_slice(hidden, batch, last))
            hidden = _slice(hidden, 0, batch)
        last = batch
        hidden = cell(step, hidden, p)
        outputs.append(_output(hidden))
    finished.append(hidden)
    finished.reverse()
    return torch.cat(outputs, 0), _concat(finished)


def _reversed_packed_layer(cell, data, batch_sizes, initial, p):
    input_w = F.linear(data, p.w_ih, p.b_ih)
    outputs = []
    offset, last = data.size(0), batch_sizes[-1]
    hidden = _slice(initial, 0, last)
    for batch in reversed(batch_sizes):
        if batch > last:  # sequences that start here (counting from the end) join
            hidden = _concat([hidden, _slice(initial, last, batch)])
        step = input_w.narrow(0, offset - batch, batch)
        offset -= batch
        last = batch
        hidden = cell(step, hidden, p)
        outputs.append(_output(hidden))
    outputs.reverse()
    return torch.cat(outputs, 0), hidden


def _layer_stack(cell, input, batch_sizes, hiddens, params, num_layers, dropout, train, bidirectional):
    directions = 2 if bidirectional else 1
    finals = []
    for layer in range(num_layers):
        h = hiddens[layer * directions:(layer + 1) * directions]
        p = params[layer * directions:(layer + 1) * directions]
        if batch_sizes is None:
            runs = (lambda hx, w: _full_layer(cell, input, hx, w),
                    lambda hx, w: _full_layer(cell, input, hx, w, reverse=True))
        else:
            runs = (lambda hx, w: _packed_layer(cell, input, batch_sizes, hx, w),
                    lambda hx, w: _reversed_packed_layer(cell, input, batch_sizes, hx, w))
        outs, fin = zip(*(run(hx, w) for run, hx, w in zip(runs[:directions], h, p)))
        input = torch.cat(outs, outs[0].dim() - 1) if bidirectional else outs[0]
        finals.extend(fin)
        if dropout != 0 and train and layer < num_layers - 1:
            input = F.dropout(input, dropout, True)
    return input, finals


def _layer_kernels(cell, split_hidden, join_finals, has_projections=lambda hx: False):
    """aten's padded (``.input``) and packed (``.data``) kernels of one recurrent layer kind.
    ``split_hidden`` turns ``hx`` into one hidden state per layer and direction, ``join_finals``
    turns the final ones back into the op's hidden results."""
    def padded(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        if batch_first:
            input = input.transpose(0, 1)
        output, finals = _layer_stack(cell, input, None, split_hidden(hx),
                                      _gather_params(params, has_biases, has_projections(hx)), num_layers,
                                      dropout, train, bidirectional)
        if batch_first:
            output = output.transpose(0, 1)
        return (output, *join_finals(finals))

    def packed(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional):
        output, finals = _layer_stack(cell, data, batch_sizes.tolist(), split_hidden(hx),
                                      _gather_params(params, has_biases, has_projections(hx)), num_layers,
                                      dropout, train, bidirectional)
        return (output, *join_finals(finals))

    return padded, packed


def _one_hidden_kernels(cell):
    return _layer_kernels(cell, lambda hx: hx.unbind(0), lambda finals: (torch.stack(finals, 0),))


def _lstm_kernels():
    return _layer_kernels(
        _lstm_step,
        lambda hx: list(zip(hx[0].unbind(0), hx[1].unbind(0))),
        lambda finals: (torch.stack([h for h, _ in finals], 0), torch.stack([c for _, c in finals], 0)),
        has_projections=lambda hx: hx[0].size(2) != hx[1].size(2))


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
    layers = {}
    for op, (padded, packed) in (("lstm", _lstm_kernels()),
                                 ("gru", _one_hidden_kernels(_gru_step)),
                                 ("rnn_tanh", _one_hidden_kernels(_simple_cell(torch.tanh))),
                                 ("rnn_relu", _one_hidden_kernels(_simple_cell(torch.relu)))):
        layers[f"{op}.input"], layers[f"{op}.data"] = padded, packed
    for name, kernel in layers.items():
        # The Autograd key, so that autograd records the ops of the kernel; PrivateUse1 too, for
        # calls without autograd (inference mode).
        library.impl(name, kernel, "AutogradPrivateUse1")
        library.impl(name, kernel, "PrivateUse1")
    _library = library
