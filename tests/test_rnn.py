"""nn.LSTM / nn.GRU / nn.RNN and their cells on neuron against CPU, forward and backward.

Layers and cells run CPU's own route on the same bytes (torch_neuronx/python_ops/host_route.py): the
same kernels on the same shapes and strides as on CPU, so every result (forward, backward, double
backward, with oneDNN on or off) is CPU's bit for bit on any CPU vendor and vector ISA. A double
backward is CPU's to rounding: an output the op saved for its own backward (tanh's result) gets
gradient contributions on both sides of the bridge, and autograd sums them in another order. The fused
cell ops, which CPU has no kernel for, are compared against the same formula run on CPU with the same
shapes (forward: exact) and against autograd through it (backward: to rounding, the chain rule is
applied in another order).
"""
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

N = "neuron"
# bfloat16: a few units in the last place (2**-8 relative) where the order of operations differs.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6)}


def _run(module, x, h, device, mkldnn=True, packed_lengths=None):
    """Forward + backward of sum(out * w) on `device`; returns outputs, input and parameter grads."""
    module = module.to(device)
    x = x.detach().to(device).requires_grad_(True)
    h = None if h is None else tuple(t.detach().to(device).requires_grad_(True) for t in h)
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        torch.manual_seed(1)  # dropout between layers draws the same numbers on both devices
        inp = x if packed_lengths is None else pack_padded_sequence(x, packed_lengths, enforce_sorted=False)
        if h is None:
            out = module(inp)
        else:
            out = module(inp, h if isinstance(module, torch.nn.LSTM) else h[0])
        if isinstance(out, torch.Tensor):
            outs = [out]
        else:
            first, hidden = out
            if packed_lengths is not None:
                first = pad_packed_sequence(first)[0]
            outs = [first, *(hidden if isinstance(hidden, tuple) else (hidden,))]
        gen = torch.Generator().manual_seed(0)
        weights = [torch.randn(o.shape, generator=gen).to(device, o.dtype) for o in outs]
        wrt = [x, *(h or ()), *module.parameters()]
        grads = torch.autograd.grad(outs, wrt, weights)
    return [o.detach().cpu() for o in outs], [g.cpu() for g in grads]


EXACT = dict(rtol=0, atol=0)


def _compare(module_fn, x, h=None, dtype=torch.float32, packed_lengths=None):
    torch.manual_seed(0)
    module = module_fn().to(dtype)
    x, h = x.to(dtype), None if h is None else tuple(t.to(dtype) for t in h)
    for mkldnn in (True, False):  # CPU's default (oneDNN for LSTM) and its generic path
        n_out, n_grads = _run(module, x, h, N, mkldnn, packed_lengths)
        c_out, c_grads = _run(module, x, h, "cpu", mkldnn, packed_lengths)
        for n, c in zip(n_out + n_grads, c_out + c_grads):
            assert n.dtype == c.dtype and n.shape == c.shape
            torch.testing.assert_close(n, c, **EXACT)


CONFIGS = [
    dict(num_layers=1),
    dict(num_layers=2, bidirectional=True),
    dict(num_layers=2, batch_first=True),
    dict(num_layers=1, bias=False),
    dict(num_layers=2, bidirectional=True, bias=False, batch_first=True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_layers_match_cpu(kind, config, dtype):
    cls = getattr(torch.nn, kind)
    batch_first = config.get("batch_first", False)
    x = torch.randn((3, 5, 4) if batch_first else (5, 3, 4))
    layers = config["num_layers"] * (2 if config.get("bidirectional") else 1)
    h = [torch.randn(layers, 3, 6)] + ([torch.randn(layers, 3, 6)] if kind == "LSTM" else [])
    _compare(lambda: cls(4, 6, **config), x, h, dtype)
    _compare(lambda: cls(4, 6, **config), x, None, dtype)  # zero initial state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_with_projections(bidirectional, dtype):
    layers = 2 * (2 if bidirectional else 1)
    h = (torch.randn(layers, 3, 2), torch.randn(layers, 3, 6))
    _compare(lambda: torch.nn.LSTM(4, 6, num_layers=2, proj_size=2, bidirectional=bidirectional),
             torch.randn(5, 3, 4), h, dtype)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_dropout_between_layers(kind):
    module = lambda: getattr(torch.nn, kind)(4, 6, num_layers=3, dropout=0.5, bidirectional=True)  # noqa: E731
    _compare(module, torch.randn(5, 3, 4))
    _compare(module, torch.randn(5, 3, 4), packed_lengths=torch.tensor([5, 2, 4]))


def test_relu_nonlinearity():
    _compare(lambda: torch.nn.RNN(4, 6, num_layers=2, nonlinearity="relu", bidirectional=True),
             torch.randn(5, 3, 4))


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_packed_sequences(kind):
    lengths = torch.tensor([5, 2, 4])
    for bidirectional in (False, True):
        _compare(lambda: getattr(torch.nn, kind)(4, 6, num_layers=2, bidirectional=bidirectional),
                 torch.randn(5, 3, 4), packed_lengths=lengths)
    if kind == "LSTM":
        _compare(lambda: torch.nn.LSTM(4, 6, proj_size=3, bidirectional=True), torch.randn(5, 3, 4),
                 packed_lengths=lengths)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_cells_match_cpu(bias, dtype):
    for cls in (torch.nn.LSTMCell, torch.nn.GRUCell, torch.nn.RNNCell):
        torch.manual_seed(0)
        cell = cls(4, 6, bias=bias).to(dtype)
        x = torch.randn(3, 4, dtype=dtype)
        h = torch.randn(3, 6, dtype=dtype)
        state = (h, torch.randn(3, 6, dtype=dtype)) if cls is torch.nn.LSTMCell else h
        results = {}
        for device in ("cpu", N):
            m = cell.to(device)
            xd = x.to(device).requires_grad_(True)
            sd = tuple(s.to(device).requires_grad_(True) for s in state) if isinstance(state, tuple) \
                else state.to(device).requires_grad_(True)
            out = m(xd, sd)
            outs = list(out) if isinstance(out, tuple) else [out]
            wrt = [xd, *(sd if isinstance(sd, tuple) else (sd,)), *m.parameters()]
            grads = torch.autograd.grad(outs, wrt, [torch.ones_like(o) * 0.5 for o in outs])
            results[device] = ([o.detach().cpu() for o in outs], [g.cpu() for g in grads])
        for n, c in zip(results[N][0] + results[N][1], results["cpu"][0] + results["cpu"][1]):
            torch.testing.assert_close(n, c, **EXACT)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_double_backward_matches_cpu(kind):
    torch.manual_seed(0)
    module = getattr(torch.nn, kind)(3, 4, num_layers=2)
    x = torch.randn(5, 2, 3)
    results = []
    for device in ("cpu", N):
        m = module.to(device)
        xd = x.to(device).requires_grad_(True)
        with torch.backends.mkldnn.flags(enabled=False):
            out = m(xd)[0]
            (gx,) = torch.autograd.grad((out * out).sum(), xd, create_graph=True)
            second = torch.autograd.grad(gx.pow(2).sum(), [xd, *m.parameters()])
        results.append([g.cpu() for g in (gx, *second)])
    torch.testing.assert_close(results[1][0], results[0][0], **EXACT)  # the first backward: exact
    for n, c in zip(results[1][1:], results[0][1:]):
        torch.testing.assert_close(n, c, **TOL[torch.float32])  # the order of summing (docstring)


@pytest.mark.parametrize("cls", [torch.nn.LSTMCell, torch.nn.GRUCell, torch.nn.RNNCell])
def test_cell_double_backward_matches_cpu(cls):
    """Under create_graph the backward's own graph is CPU's too: the host route's Functions
    differentiate into each other (to rounding: the docstring's order of summing)."""
    torch.manual_seed(0)
    cell = cls(3, 4)
    x = torch.randn(2, 3)
    results = []
    for device in ("cpu", N):
        m = cell.to(device)
        xd = x.to(device).requires_grad_(True)
        out = m(xd)
        out = out[0] if isinstance(out, tuple) else out
        (gx,) = torch.autograd.grad((out * out).sum(), xd, create_graph=True)
        second = torch.autograd.grad(gx.pow(2).sum(), [xd, *m.parameters()])
        results.append([g.cpu() for g in (gx, *second)])
    torch.testing.assert_close(results[1][0], results[0][0], **EXACT)  # the first backward: exact
    for n, c in zip(results[1][1:], results[0][1:]):
        torch.testing.assert_close(n, c, **TOL[torch.float32])


@pytest.mark.parametrize("mkldnn", [True, False])
def test_inference_mode_and_no_grad(mkldnn):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 6)
    x = torch.randn(5, 3, 4)
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=mkldnn):
        expected = lstm(x)[0]
        lstm = lstm.to(N)
        with torch.inference_mode():
            got = lstm(x.to(N))[0]
        assert got.device.type == N and got.is_inference()
        torch.testing.assert_close(got.cpu(), expected, **EXACT)
        got = lstm(x.to(N))[0]
    torch.testing.assert_close(got.cpu(), expected, **EXACT)


def test_fused_cell_ops_directly():
    """The ATen ops themselves (forward), against CPU's unfused cell (nn.LSTMCell's CPU path)."""
    torch.manual_seed(0)
    igates, hgates = torch.randn(3, 24), torch.randn(3, 24)
    cx, b_ih, b_hh = torch.randn(3, 6), torch.randn(24), torch.randn(24)
    hy, cy, workspace = torch.ops.aten._thnn_fused_lstm_cell(igates.to(N), hgates.to(N), cx.to(N), b_ih.to(N), b_hh.to(N))
    gates = (hgates + b_hh) + (igates + b_ih)
    i, f, g, o = gates.chunk(4, 1)
    c_expected = f.sigmoid() * cx + i.sigmoid() * g.tanh()
    torch.testing.assert_close(cy.cpu(), c_expected, rtol=0, atol=0)
    torch.testing.assert_close(hy.cpu(), o.sigmoid() * c_expected.tanh(), rtol=0, atol=0)
    assert workspace.shape == (3, 24) and workspace.device.type == N

    ig, hg, hx = torch.randn(3, 18), torch.randn(3, 18), torch.randn(3, 6)
    hy, workspace = torch.ops.aten._thnn_fused_gru_cell(ig.to(N), hg.to(N), hx.to(N))
    r = (hg[:, :6] + ig[:, :6]).sigmoid()
    z = (hg[:, 6:12] + ig[:, 6:12]).sigmoid()
    n = (ig[:, 12:] + hg[:, 12:] * r).tanh()
    torch.testing.assert_close(hy.cpu(), (hx - n) * z + n, rtol=0, atol=0)
    assert workspace.shape == (3, 30)


@pytest.mark.parametrize("bias", [True, False])
def test_fused_cell_backward_kernels(bias):
    """_thnn_fused_lstm_cell_backward_impl / _thnn_fused_gru_cell_backward (what autograd calls
    without create_graph) against autograd through the same cell written with CPU ops."""
    torch.manual_seed(0)
    ig, hg, cx = torch.randn(3, 24), torch.randn(3, 24), torch.randn(3, 6)
    biases = [torch.randn(24), torch.randn(24)] if bias else [None, None]

    def lstm_reference(ig, hg, cx, b_ih, b_hh):
        gates = ig + hg if b_ih is None else (hg + b_hh) + (ig + b_ih)
        i, f, g, o = gates.chunk(4, 1)
        cy = f.sigmoid() * cx + i.sigmoid() * g.tanh()
        return o.sigmoid() * cy.tanh(), cy

    gru_ig, gru_hg, hx = torch.randn(3, 18), torch.randn(3, 18), torch.randn(3, 6)
    gru_biases = [torch.randn(18), torch.randn(18)] if bias else [None, None]

    def gru_reference(ig, hg, hx, b_ih, b_hh):
        if b_ih is not None:
            ig, hg = ig + b_ih, hg + b_hh
        r = (hg[:, :6] + ig[:, :6]).sigmoid()
        z = (hg[:, 6:12] + ig[:, 6:12]).sigmoid()
        n = (ig[:, 12:] + hg[:, 12:] * r).tanh()
        return ((hx - n) * z + n,)

    cases = [(torch.ops.aten._thnn_fused_lstm_cell, lstm_reference, [ig, hg, cx, *biases], 2),
             (torch.ops.aten._thnn_fused_gru_cell, gru_reference, [gru_ig, gru_hg, hx, *gru_biases], 1)]
    for op, reference, inputs, n_out in cases:
        leaves = [None if t is None else t.clone().requires_grad_(True) for t in inputs]
        expected = torch.autograd.grad(reference(*leaves), [t for t in leaves if t is not None],
                                       [torch.full((3, 6), 0.5 + k) for k in range(n_out)])
        on_neuron = [None if t is None else t.to(N).requires_grad_(True) for t in inputs]
        outs = op(*on_neuron)[:n_out]
        got = torch.autograd.grad(outs, [t for t in on_neuron if t is not None],
                                  [torch.full((3, 6), 0.5 + k, device=N) for k in range(n_out)])
        for g, e in zip(got, expected):
            assert g.device.type == N
            torch.testing.assert_close(g.cpu(), e, **TOL[torch.float32])


def test_dropout_draws_from_cpus_generator_as_cpus_run_does():
    """The layer's dropout draws from CPU's default generator, as every random op on neuron does
    (TorchNeuron's CPU fallback): the same numbers as CPU's run, and CPU's stream left where CPU's
    run leaves it."""
    gru = torch.nn.GRU(4, 6, num_layers=3, dropout=0.5)
    x = torch.randn(5, 3, 4)
    torch.manual_seed(7)
    expected = gru(x)[0]
    cpu_after = torch.get_rng_state()
    torch.manual_seed(7)
    gru = gru.to(N)
    got = gru(x.to(N))[0]
    torch.testing.assert_close(got.cpu(), expected, **EXACT)
    assert torch.equal(torch.get_rng_state(), cpu_after)


def test_results_are_neuron_memory_counted_once():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 16, num_layers=2).to(N)
    x = torch.randn(7, 3, 8, device=N)
    state = (torch.zeros(2, 3, 16, device=N), torch.zeros(2, 3, 16, device=N))
    before = torch.neuron.memory_allocated()
    out, (h, c) = lstm(x, state)
    fresh = sum(t.untyped_storage().nbytes() for t in (out, h, c))
    assert out.device.type == h.device.type == c.device.type == N
    assert torch.neuron.memory_allocated() - before == fresh
    del out, h, c
    assert torch.neuron.memory_allocated() == before


def test_arguments_on_another_device_are_refused():
    gru = torch.nn.GRU(4, 6).to(N)
    x = torch.randn(5, 3, 4, device=N)
    with pytest.raises(RuntimeError, match="same device.*cpu.*neuron:0"):
        gru(x, torch.zeros(1, 3, 6))  # the initial state left on the CPU
    with pytest.raises(RuntimeError, match="same device.*cpu.*neuron:0"):
        torch.nn.GRUCell(4, 6).to(N)(x[0], torch.zeros(3, 6))
    if torch.neuron.device_count() > 1:
        with pytest.raises(RuntimeError, match="same device.*neuron:0.*neuron:1"):
            gru(x, torch.zeros(1, 3, 6, device="neuron:1"))


def test_layer_on_a_second_device_stays_there():
    if torch.neuron.device_count() < 2:
        pytest.skip("one neuron device in this topology")
    torch.manual_seed(0)
    gru = torch.nn.GRU(4, 6)
    x = torch.randn(5, 3, 4, requires_grad=True)
    expected = gru(x)[0]
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    gru = gru.to("neuron:1")
    xn = x.detach().to("neuron:1").requires_grad_(True)
    got = gru(xn)[0]
    (grad,) = torch.autograd.grad(got.sum(), xn)
    assert got.device == grad.device == torch.device("neuron:1")
    torch.testing.assert_close(got.cpu(), expected, **EXACT)
    torch.testing.assert_close(grad.cpu(), expected_grad, **EXACT)


def test_host_route_maps_views_of_arguments_back():
    """A CPU result over an argument's bytes comes back as a view of that neuron storage: no new
    memory is adopted or counted, and writes through it are seen by the argument."""
    from torch_neuronx.python_ops.host_route import host_route

    transpose = host_route(lambda t: t.t(), "transpose")
    x = torch.arange(6.0, device=N).reshape(2, 3)
    before = torch.neuron.memory_allocated()
    y = transpose(x)
    assert y.device.type == N and y.shape == (3, 2)
    assert y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert torch.neuron.memory_allocated() == before
    y[0, 1] = -1.0
    assert x[1, 0].item() == -1.0


# ---- what Trainium makes of them ----------------------------------------------------------------
_NO_KERNEL = {"LSTM": "_thnn_fused_lstm_cell", "GRU": "_thnn_fused_gru_cell",
              "LSTMCell": "_thnn_fused_lstm_cell", "GRUCell": "_thnn_fused_gru_cell"}


def _call(name, module, x):
    return module(x if name.endswith("Cell") else x.unsqueeze(0))


@pytest.mark.parametrize("name", ["LSTM", "GRU", "LSTMCell", "GRUCell", "RNN", "RNNCell"])
def test_the_report_says_an_lstm_or_gru_would_fail_and_an_rnn_would_not(collect, name):
    """On a PrivateUse1 device ATen steps LSTM and GRU through fused cells: TorchNeuron has no kernel for
    them and its CPU fallback finds no CPU kernel (its ddp_spec.json, test_ddp_packed_sequence)."""
    import inspect
    module = getattr(torch.nn, name)(4, 3).to(N)
    x = torch.randn(2, 4, device=N, requires_grad=True)
    out = module(x if name.endswith("Cell") else x.unsqueeze(0)); line = inspect.currentframe().f_lineno
    (out[0] if isinstance(out, tuple) else out).sum().backward()
    found = [f for f in collect().findings if f.kind == "no-kernel"]
    if name not in _NO_KERNEL:
        assert found == []
        return
    (finding,) = found
    assert finding.site == f"{__file__}:{line}" and finding.severity == "would-fail"
    assert _NO_KERNEL[name] in finding.details[0]


@pytest.mark.parametrize("name", ["LSTM", "GRUCell"])
def test_trainium_semantics_raise_torchneurons_error_and_cpu_semantics_run(name):
    import torch_neuronx
    module = getattr(torch.nn, name)(4, 3).to(N)
    x = torch.randn(2, 4, device=N)
    with torch_neuronx.eager_semantics(), pytest.raises(RuntimeError) as raised:
        _call(name, module, x)
    assert f"Could not run 'aten::{_NO_KERNEL[name]}' with arguments from the 'CPU' backend" in str(raised.value)
    with torch_neuronx.eager_semantics(), torch.inference_mode(), pytest.raises(RuntimeError, match="fused"):
        torch.ops.aten._thnn_fused_lstm_cell(*(torch.randn(2, 12, device=N),) * 2, torch.randn(2, 3, device=N))
    with torch_neuronx.eager_semantics():
        torch.nn.RNN(4, 3).to(N)(x.unsqueeze(0))  # unfused cells: fine on Trainium
    _call(name, module, x)  # cpu semantics: CPU's route


# ---- what the report counts: the route Trainium takes ----------------------------------------------
RNN_PROGRAM = """
import torch
torch.manual_seed(0)
rnn = torch.nn.RNN(4, 3, num_layers=2, nonlinearity="{nonlinearity}", bidirectional={bidirectional}).to("neuron")
cell = torch.nn.RNNCell(4, 3).to("neuron")
x = torch.randn(5, 2, 4, device="neuron", requires_grad=True)
out, h = rnn(x)
(out.sum() + h.sum() + cell(x[0]).sum()).backward()
"""


@pytest.mark.parametrize("nonlinearity, bidirectional", [("tanh", False), ("relu", True)])
def test_an_rnn_is_counted_step_by_step_as_the_plan_simulator_runs_it(tmp_path, collect, simulate,
                                                                       nonlinearity, bidirectional):
    """On Trainium nn.RNN and nn.RNNCell decompose (TorchNeuron registers neither): each time step's
    linear layers, add and activation are kernel calls of their own, forward and backward. The report
    counts that route while the values stay CPU's; the plan simulator's fake tensors take it too, so
    both give the program the same launches and time."""
    import json

    program = RNN_PROGRAM.format(nonlinearity=nonlinearity, bidirectional=bidirectional)
    exec(compile(program, "rnn_program.py", "exec"), {})
    report = json.loads(collect().to_json())
    (tmp_path / "rnn_program.py").write_text(program)
    r, plan = simulate(tmp_path, str(tmp_path / "rnn_program.py"))
    assert r.returncode == 0, r.stderr
    launches = sum(n["launches"] for n in report["neffs"])
    assert launches == plan["ranks"][0]["eager_launches"] > 100
    assert report["steady_state_seconds"] == pytest.approx(plan["ranks"][0]["step_seconds"], rel=1e-6)
    executed = report["executed_ops"]
    assert not any("rnn_" in op for op in executed), executed
    assert {"aten::addmm", f"aten::{nonlinearity}", "aten::mm"} <= set(executed), executed


def test_an_rnn_counted_step_by_step_still_gives_cpus_values():
    rnn = torch.nn.RNN(4, 3, num_layers=2)
    x = torch.randn(5, 2, 4)
    cpu_out, cpu_h = rnn(x)
    out, h = rnn.to(N)(x.to(N))
    assert torch.equal(out.cpu(), cpu_out) and torch.equal(h.cpu(), cpu_h)
