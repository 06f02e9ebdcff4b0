"""ModuleInfo conformance sweep: PyTorch's own ``module_db``, float32, neuron against CPU (the oracle).

For every ModuleInfo that supports float32 and each of its module inputs (made on CPU), the module
is built once on CPU with a fixed seed and deep-copied to neuron, so both start from the same
parameters and buffers. Both run the same forward (same RNG seed: dropout must agree bit for bit),
in training mode, and in eval mode too where module_db says the two differ. Compared:

* the outputs (values, dtype, shape, device), and the buffers after the call (running statistics);
* the gradients, w.r.t. every parameter and every input that requires grad, of
  ``sum(out_i * w_i)`` over the outputs that require grad, with fixed pseudo-random weights ``w_i``.

The same CPU kernels run on both sides, so results must be bit-identical (tolerance 0), except
where TOLERANCES says otherwise with its reason. module_db's own skips and decorators are dropped
(they describe CUDA/MPS differences, not neuron's); the only expected failures are listed below
with their reasons, and one that starts passing fails the run. Single-threaded and seeded directly,
as the OpInfo sweep (tests/test_opinfo.py) is, for speed.

Generated tests: ``TestModulePRIVATEUSE1::test_forward_backward_<module>_<train|eval>_mode_neuron_float32``.
"""
import copy
import unittest

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_modules import module_db, modules
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.opinfo.core import DecorateInfo

from helpers import sweeps

N = "neuron"

# Key: module name as module_db spells it. Value: why its sweep fails. Applied as expectedFailure.
EXPECTED_FAILURES: dict[str, str] = {}

# Where bit-identity is not expected: (rtol, atol), with the reason.
TOLERANCES: dict[str, tuple[tuple[float, float], str]] = {}

# module_db makes FractionalMaxPool's `_random_samples` float64 whatever the dtype under test, which
# CPU refuses for float32 inputs ("Expect _random_samples to have the same dtype as input"): they
# are cast to the input's dtype, so the modules are compared rather than both sides raising.
_RANDOM_SAMPLES_AS_INPUT_DTYPE = {"nn.FractionalMaxPool2d", "nn.FractionalMaxPool3d"}

_names = {m.name for m in module_db}
_stale = sorted(k for k in (*EXPECTED_FAILURES, *TOLERANCES, *_RANDOM_SAMPLES_AS_INPUT_DTYPE) if k not in _names)
assert not _stale, f"EXPECTED_FAILURES/TOLERANCES name modules that are not in module_db: {_stale}"


def _with_our_decorators(info):
    info = copy.copy(info)
    info.decorators = ()
    if info.name in EXPECTED_FAILURES:
        info.decorators = (DecorateInfo(unittest.expectedFailure, "TestModule", "test_forward_backward"),)
    return info


MODULES = [_with_our_decorators(m) for m in module_db if torch.float32 in m.dtypes]


def _map(x, fn):
    """Apply fn to every tensor of a nested structure (containers keep their types)."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, torch.nn.utils.rnn.PackedSequence):
        return x.to(N) if fn is _to_neuron else x
    if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
        items = [_map(v, fn) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return x


def _to_neuron(t):
    moved = t.detach().to(N)
    return moved.requires_grad_(t.requires_grad) if t.is_leaf else moved


def _fresh(t):
    copied = t.detach().clone()
    return copied.requires_grad_(t.requires_grad) if t.is_leaf else copied


def _leaves(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, torch.nn.utils.rnn.PackedSequence):
        return [x.data]
    if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
        return [t for v in x for t in _leaves(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _leaves(v)]
    return []


class TestModule(TestCase):
    def _compare(self, name, what, neuron, cpu):
        (rtol, atol), _ = TOLERANCES.get(name, ((0.0, 0.0), ""))
        self.assertEqual(len(neuron), len(cpu), msg=f"{what}: {len(neuron)} tensors, on CPU {len(cpu)}")
        for i, (n, c) in enumerate(zip(neuron, cpu)):
            where = f"{what}[{i}]"
            if n is None or c is None:
                self.assertIs(n, c, msg=f"{where}: None on one side only")
                continue
            self.assertEqual(n.device.type, N, msg=f"{where}: on {n.device}")
            self.assertEqual((n.dtype, n.shape), (c.dtype, c.shape), msg=f"{where}: dtype/shape")
            n_host = n.detach().cpu()
            if torch.equal(n_host, c.detach()):
                continue
            torch.testing.assert_close(n_host, c.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m, w=where: f"{w}: {m}")

    @modules(MODULES, allowed_dtypes=(torch.float32,))
    def test_forward_backward(self, device, dtype, module_info, training):
        with sweeps.one_thread():
            self._run(module_info, training)

    def _run(self, info, training):
        sweeps.seed()
        inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True,
                                         training=training)
        compared = 0
        for k, module_input in enumerate(inputs):
            if module_input.forward_input is None:
                continue
            what = f"input {k} ({module_input.desc or 'default'})"
            ctor = module_input.constructor_input
            ctor_kwargs = dict(ctor.kwargs)
            if info.name in _RANDOM_SAMPLES_AS_INPUT_DTYPE:
                ctor_kwargs["_random_samples"] = ctor_kwargs["_random_samples"].float()
            sweeps.seed()
            cpu_module = info.module_cls(*ctor.args, **ctor_kwargs)
            neuron_module = copy.deepcopy(cpu_module).to(N)
            cpu_module.train(training)
            neuron_module.train(training)
            fwd = module_input.forward_input
            c_args, c_kwargs = _map(fwd.args, _fresh), _map(fwd.kwargs, _fresh)
            n_args, n_kwargs = _map(fwd.args, _to_neuron), _map(fwd.kwargs, _to_neuron)
            sweeps.seed()
            try:
                c_out = cpu_module(*c_args, **c_kwargs)
            except Exception as e:  # the neuron call must fail the same way
                with self.assertRaises(type(e), msg=f"{what}: raises {type(e).__name__} on CPU ({e})"):
                    sweeps.seed()
                    neuron_module(*n_args, **n_kwargs)
                continue
            sweeps.seed()
            n_out = neuron_module(*n_args, **n_kwargs)
            c_outs, n_outs = _leaves(c_out), _leaves(n_out)
            self._compare(info.name, f"{what} output", n_outs, c_outs)
            self._compare(info.name, f"{what} buffers", list(neuron_module.buffers()), list(cpu_module.buffers()))
            compared += 1

            c_diff = [o for o in c_outs if o.requires_grad]
            n_diff = [o for o in n_outs if o.requires_grad]
            self.assertEqual(len(n_diff), len(c_diff), msg=f"{what}: outputs requiring grad differ")
            c_wrt = [p for p in cpu_module.parameters() if p.requires_grad]
            c_wrt += [t for t in _leaves((c_args, c_kwargs)) if t.requires_grad]
            n_wrt = [p for p in neuron_module.parameters() if p.requires_grad]
            n_wrt += [t for t in _leaves((n_args, n_kwargs)) if t.requires_grad]
            if not c_diff or not c_wrt:
                continue
            gen = torch.Generator().manual_seed(sweeps.SEED + k)
            c_w = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in c_diff]
            n_w = [w.to(N) for w in c_w]
            sweeps.seed()
            c_grads = torch.autograd.grad(c_diff, c_wrt, c_w, allow_unused=True)
            sweeps.seed()
            n_grads = torch.autograd.grad(n_diff, n_wrt, n_w, allow_unused=True)
            self._compare(info.name, f"{what} grad", list(n_grads), list(c_grads))
        if not compared:
            self.fail("no module input compared: list the module with a reason")


instantiate_device_type_tests(TestModule, globals(), only_for=("neuron",))

if __name__ == "__main__":
    run_tests()


def _ops_run(module, x):
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        module(x)
    return {event.key for event in prof.key_averages() if event.key.startswith("aten::")}


def test_transformer_encoder_layer_takes_cpus_route_in_eval():
    """nn.TransformerEncoderLayer's fast path (_transformer_encoder_layer_fwd) lists privateuseone
    among its devices: with batch_first it runs on neuron as on CPU, without it neither takes it."""
    for batch_first in (True, False):
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=batch_first).eval()
        x = torch.randn(2, 5, 32)
        on_cpu = _ops_run(layer, x)
        on_neuron = _ops_run(copy.deepcopy(layer).to(N), x.to(N))
        assert ("aten::_transformer_encoder_layer_fwd" in on_cpu) == batch_first
        # CPU's flash kernel runs on neuron under TorchNeuron's name for it (its SDPA backend choice)
        flash, fused = "aten::_scaled_dot_product_flash_attention_for_cpu", \
            "aten::_scaled_dot_product_fused_attention_overrideable"
        assert (flash in on_cpu) == (not batch_first) and (fused in on_neuron) == (not batch_first)
        assert on_neuron - {fused} == on_cpu - {flash}, on_neuron ^ on_cpu
        with torch.no_grad():
            expected = layer(x)
            torch.testing.assert_close(copy.deepcopy(layer).to(N)(x.to(N)).cpu(), expected, rtol=0, atol=0)
