"""OpInfo conformance sweep: every op of PyTorch's own ``op_db``, float32, neuron against CPU.

For every OpInfo that supports float32, every sample input is run on neuron and on an exact CPU
copy of it (same sizes, strides, storage offset, requires_grad), with the same RNG seed on both
sides, and the two are compared:

* forward (``test_forward``): outputs (values, dtype, shape, strides, and whether an output aliases
  an input), and the inputs after the call (so in-place/out mutations that get lost are caught);
* backward (``test_backward``, ops with ``supports_autograd`` and float32 backward): the gradients,
  w.r.t. every input that requires grad, of ``sum(out_i * w_i)`` over the floating outputs, with
  fixed pseudo-random weights ``w_i`` (a plain ``sum`` gives all-zero or constant grads for many
  ops, e.g. softmax, and would test little).

The same CPU kernels run on both sides (the zero-copy fallback), so results are expected to be
bit-identical: the default tolerance is 0. op_db's own skip/xfail decorators are dropped on purpose:
they describe CUDA-vs-CPU or reference differences, not neuron-vs-CPU. The only skips and expected
failures are the ones listed below, each with its reason. An expected failure that starts passing
fails the run (``unittest.expectedFailure``), so the lists cannot go stale silently.

Generated names: ``TestOpInfoPRIVATEUSE1::test_forward_<op>_neuron_float32``.
"""
import copy
import unittest

import torch
from torch.testing._internal.common_device_type import (
    instantiate_device_type_tests,
    ops,
)
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.opinfo.core import DecorateInfo
from torch.utils._pytree import tree_flatten, tree_map

# At most this many sample inputs per op and test (op_db order: the first samples are the
# basic shapes; the tail is mostly more of the same with other sizes). Keeps the file fast.
MAX_SAMPLES = None

# Key: (op full name, "forward" | "backward"). Value: why it fails. Applied as
# unittest.expectedFailure. Reasons starting "BUG:" are backend bugs to be fixed in the core.
EXPECTED_FAILURES: dict[tuple[str, str], str] = {}

# Key as above. Only for what truly cannot run (crash, hang, far too slow). Applied as skip.
SKIPS: dict[tuple[str, str], str] = {}

# Outputs whose *values* are unspecified (uninitialized memory): compare metadata only.
METADATA_ONLY = {
    "empty": "returns uninitialized memory",
    "empty_like": "returns uninitialized memory",
    "empty_strided": "returns uninitialized memory",
    "empty_permuted": "returns uninitialized memory",
    "new_empty": "returns uninitialized memory",
    "new_empty_strided": "returns uninitialized memory",
}

# Per-op tolerances (rtol, atol) where bit-identity is not expected. Each with the reason.
TOLERANCES: dict[tuple[str, str], tuple[float, float]] = {}

SEED = 1234
CLASS_NAME = "TestOpInfo"


def _with_our_decorators(op):
    """A copy of `op` whose decorators are ours only (see the module docstring)."""
    op = copy.copy(op)
    decorators = []
    for test in ("forward", "backward"):
        key = (op.full_name, test)
        if key in SKIPS:
            decorators.append(DecorateInfo(unittest.skip(SKIPS[key]), CLASS_NAME, f"test_{test}"))
        elif key in EXPECTED_FAILURES:
            decorators.append(DecorateInfo(unittest.expectedFailure, CLASS_NAME, f"test_{test}"))
    op.decorators = tuple(decorators)
    op.skips = ()
    return op


_unknown = sorted({k for k in (*EXPECTED_FAILURES, *SKIPS) if k[0] not in {o.full_name for o in op_db}})
assert not _unknown, f"EXPECTED_FAILURES/SKIPS name ops that are not in op_db: {_unknown}"

FORWARD_OPS = [_with_our_decorators(op) for op in op_db if op.supports_dtype(torch.float32, "cpu")]
BACKWARD_OPS = [
    _with_our_decorators(op)
    for op in op_db
    if op.supports_autograd and torch.float32 in op.supported_backward_dtypes("cpu")
]


def _is_neuron_device(value):
    return (isinstance(value, torch.device) and value.type == "neuron") or (
        isinstance(value, str) and value.split(":")[0] == "neuron"
    )


def _tensor_to_cpu(t):
    """An exact CPU copy: same sizes, strides and storage offset (so kernels see the same layout
    and take the same code path), same requires_grad; a leaf."""
    if t.layout != torch.strided or t.is_conj() or t.is_neg():
        c = t.detach().resolve_conj().resolve_neg().to("cpu")
    else:
        storage = t.detach().untyped_storage().cpu()
        c = torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.size(), t.stride())
    return c.requires_grad_(t.requires_grad)


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return _tensor_to_cpu(obj)
    if _is_neuron_device(obj):
        return torch.device("cpu") if isinstance(obj, torch.device) else "cpu"
    return obj


def _cpu_sample(sample):
    # One CPU copy per distinct neuron tensor, so an argument passed twice stays one tensor.
    memo = {}

    def conv(x):
        if isinstance(x, torch.Tensor):
            if id(x) not in memo:
                memo[id(x)] = _tensor_to_cpu(x)
            return memo[id(x)]
        return _to_cpu(x)

    return (
        tree_map(conv, sample.input),
        tree_map(conv, sample.args),
        tree_map(conv, sample.kwargs),
    )


def _run(op, sample, inp, args, kwargs):
    torch.manual_seed(SEED)  # seeds the CPU and every neuron generator alike
    out = op(inp, *args, **kwargs)
    return sample.output_process_fn_grad(out)


def _samples(op, device, requires_grad):
    for i, sample in enumerate(op.sample_inputs(device, torch.float32, requires_grad=requires_grad)):
        if MAX_SAMPLES is not None and i >= MAX_SAMPLES:
            return
        yield i, sample


class TestOpInfo(TestCase):
    exact_dtype = True

    def _assert_same(self, op, test, neuron, cpu, what, metadata_only=False):
        n_leaves, n_spec = tree_flatten(neuron)
        c_leaves, c_spec = tree_flatten(cpu)
        self.assertEqual(str(n_spec), str(c_spec), msg=f"{what}: structure differs")
        rtol, atol = TOLERANCES.get((op.full_name, test), (0.0, 0.0))
        for i, (n, c) in enumerate(zip(n_leaves, c_leaves)):
            if isinstance(c, torch.Tensor):
                self.assertIsInstance(n, torch.Tensor, msg=f"{what}[{i}]")
                self.assertEqual(n.device.type, "neuron", msg=f"{what}[{i}]: not on neuron")
                self.assertEqual(n.dtype, c.dtype, msg=f"{what}[{i}]: dtype")
                self.assertEqual(n.layout, c.layout, msg=f"{what}[{i}]: layout")
                self.assertEqual(n.shape, c.shape, msg=f"{what}[{i}]: shape")
                if c.layout == torch.strided and c.numel() > 1:
                    self.assertEqual(n.stride(), c.stride(), msg=f"{what}[{i}]: strides")
                if metadata_only:
                    continue
                torch.testing.assert_close(
                    n.detach().cpu(), c.detach(), rtol=rtol, atol=atol, equal_nan=True,
                    msg=lambda m, i=i: f"{what}[{i}]: {m}",
                )
            elif isinstance(c, torch.device):
                self.assertEqual(n.type, "neuron" if c.type == "cpu" else c.type, msg=f"{what}[{i}]")
            else:
                self.assertEqual(n, c, msg=f"{what}[{i}]", exact_device=False)

    @staticmethod
    def _aliasing(outputs, inputs):
        """For each output tensor, the index of the input tensor whose storage it shares (or -1)."""
        in_ptrs = [t.untyped_storage().data_ptr() if t.layout == torch.strided else None for t in inputs]
        result = []
        for o in outputs:
            if isinstance(o, torch.Tensor) and o.layout == torch.strided and o.untyped_storage().nbytes():
                p = o.untyped_storage().data_ptr()
                result.append(next((j for j, q in enumerate(in_ptrs) if q == p), -1))
            else:
                result.append(-1)
        return result

    @ops(FORWARD_OPS, allowed_dtypes=(torch.float32,))
    def test_forward(self, device, dtype, op):
        metadata_only = op.name in METADATA_ONLY
        for i, sample in _samples(op, device, requires_grad=False):
            cinp, cargs, ckwargs = _cpu_sample(sample)
            c_out = _run(op, sample, cinp, cargs, ckwargs)
            n_out = _run(op, sample, sample.input, sample.args, sample.kwargs)
            what = f"sample {i} ({sample.summary() if hasattr(sample, 'summary') else sample})"
            self._assert_same(op, "forward", n_out, c_out, f"{what} output", metadata_only)
            # Inputs after the call: mutations must land in neuron memory as they do on CPU.
            self._assert_same(
                op, "forward", (sample.input, sample.args, sample.kwargs), (cinp, cargs, ckwargs),
                f"{what} inputs after the call", metadata_only,
            )
            n_in = [t for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0] if isinstance(t, torch.Tensor)]
            c_in = [t for t in tree_flatten((cinp, cargs, ckwargs))[0] if isinstance(t, torch.Tensor)]
            self.assertEqual(
                self._aliasing(tree_flatten(n_out)[0], n_in),
                self._aliasing(tree_flatten(c_out)[0], c_in),
                msg=f"{what}: which outputs alias which inputs",
            )

    @ops(BACKWARD_OPS, allowed_dtypes=(torch.float32,))
    def test_backward(self, device, dtype, op):
        tested = 0
        for i, sample in _samples(op, device, requires_grad=True):
            cinp, cargs, ckwargs = _cpu_sample(sample)
            n_in = [t for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0]
                    if isinstance(t, torch.Tensor) and t.requires_grad]
            c_in = [t for t in tree_flatten((cinp, cargs, ckwargs))[0]
                    if isinstance(t, torch.Tensor) and t.requires_grad]
            if not n_in:
                continue
            c_out = [t for t in tree_flatten(_run(op, sample, cinp, cargs, ckwargs))[0]
                     if isinstance(t, torch.Tensor) and t.requires_grad]
            n_out = [t for t in tree_flatten(_run(op, sample, sample.input, sample.args, sample.kwargs))[0]
                     if isinstance(t, torch.Tensor) and t.requires_grad]
            self.assertEqual(len(n_out), len(c_out), msg=f"sample {i}: outputs requiring grad")
            if not c_out:
                continue
            gen = torch.Generator().manual_seed(SEED + i)
            c_w = [torch.randn(t.shape, dtype=t.dtype, generator=gen) for t in c_out]
            n_w = [w.to(device) for w in c_w]
            torch.manual_seed(SEED)
            c_grads = torch.autograd.grad(c_out, c_in, c_w, allow_unused=True)
            torch.manual_seed(SEED)
            n_grads = torch.autograd.grad(n_out, n_in, n_w, allow_unused=True)
            self._assert_same(op, "backward", list(n_grads), list(c_grads), f"sample {i} grads")
            tested += 1


instantiate_device_type_tests(TestOpInfo, globals(), only_for=("neuron",))

if __name__ == "__main__":
    run_tests()
