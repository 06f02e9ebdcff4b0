"""OpInfo conformance sweep: PyTorch's own ``op_db``, float32, neuron against CPU (the oracle).

For every OpInfo that supports float32, sample inputs are made on neuron; each is copied exactly
to CPU (same sizes, strides, storage offset and storage sharing, same requires_grad) and the op
runs on both, with the same RNG seed on both sides (random ops must then agree bit for bit):

* ``test_forward``: outputs (values, dtype, shape, strides, device, which outputs alias which
  inputs) and the input tensors after the call (mutations must land in neuron memory). If the CPU
  call raises, the neuron call must raise the same exception type.
* ``test_backward`` (ops with ``supports_autograd`` and a float32 backward): gradients w.r.t. every
  input that requires grad of ``sum(out_i * w_i)`` over the outputs that require grad, with fixed
  pseudo-random weights ``w_i`` (a plain ``sum`` gives zero or constant grads for many ops, e.g.
  softmax, and would test little).

The same CPU kernels run on both sides (the zero-copy fallback), so results must be bit-identical:
the default tolerance is 0. op_db's own skip/xfail/tolerance decorators are dropped on purpose: they
describe CUDA-vs-CPU or reference-vs-torch differences, not neuron-vs-CPU. The only skips and
expected failures are the ones listed below, each with its reason. An expected failure that starts
passing fails the run (``unittest.expectedFailure``), so the lists cannot go stale silently. A test
that compares nothing (no sample ran, or every sample raised on CPU) fails.

Generated tests: ``TestOpInfoPRIVATEUSE1::test_{forward,backward}_<op>_neuron_float32``.
"""
import copy
import os
import unittest

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.opinfo.core import DecorateInfo

from helpers import sweeps

# Every sample of every op by default. For a quicker pass, NEURON_OPINFO_MAX_SAMPLES=N runs only
# the first N samples of each op (op_db lists the basic cases first).
MAX_SAMPLES = int(os.environ.get("NEURON_OPINFO_MAX_SAMPLES", "0"))

_SPARSE = "sparse layouts are not supported on neuron (NotImplementedError 'not supported on neuron')"
_JITERATOR = "Jiterator is CUDA-only: raises on CPU too, so there is nothing to compare"

# Key: (op full name, "forward" | "backward"). Value: why it fails. Applied as
# unittest.expectedFailure. Reasons starting "BUG:" are backend bugs, to be fixed in the core.
EXPECTED_FAILURES: dict[tuple[str, str], str] = {
    ("jiterator_unary", "forward"): _JITERATOR,
    ("jiterator_binary", "forward"): _JITERATOR,
    ("jiterator_binary_return_by_ref", "forward"): _JITERATOR,
    ("jiterator_2inputs_2outputs", "forward"): _JITERATOR,
    ("jiterator_4inputs_with_extra_args", "forward"): _JITERATOR,
    ("to_sparse", "forward"): _SPARSE,
    ("to_sparse", "backward"): _SPARSE,
    ("sparse.mm.reduce", "forward"): _SPARSE,
    ("sparse.mm.reduce", "backward"): _SPARSE,
    ("sparse.sampled_addmm", "forward"): _SPARSE,
    ("sparse.sampled_addmm", "backward"): _SPARSE,
}

# Key as above. Only for what truly cannot run (crash, hang, far too slow). Applied as skip.
SKIPS: dict[tuple[str, str], str] = {}

# Ops whose output *values* are unspecified (uninitialized memory): metadata is still compared.
METADATA_ONLY = {
    "empty": "returns uninitialized memory",
    "empty_like": "returns uninitialized memory",
    "empty_strided": "returns uninitialized memory",
    "empty_permuted": "returns uninitialized memory",
    "new_empty": "returns uninitialized memory",
    "new_empty_strided": "returns uninitialized memory",
}

# Per-op (rtol, atol) where bit-identity is not expected, keyed like EXPECTED_FAILURES, each with
# its reason in a comment.
TOLERANCES: dict[tuple[str, str], tuple[float, float]] = {
    # driver="gelsy" (MKL LAPACK) is not reproducible even CPU against CPU: the same call on the
    # same values differs in the last bits from run to run (depends on buffer alignment).
    ("linalg.lstsq", "forward"): (1e-5, 1e-5),
    ("linalg.lstsq.grad_oriented", "forward"): (1e-5, 1e-5),
    ("linalg.lstsq", "backward"): (1e-5, 1e-5),
    ("linalg.lstsq.grad_oriented", "backward"): (1e-5, 1e-5),
}

N = "neuron"


def _with_our_decorators(op):
    """A copy of `op` whose decorators are ours only (see the module docstring)."""
    op = copy.copy(op)
    decorators = []
    for test in ("forward", "backward"):
        key = (op.full_name, test)
        if key in SKIPS:
            decorators.append(DecorateInfo(unittest.skip(SKIPS[key]), "TestOpInfo", f"test_{test}"))
        elif key in EXPECTED_FAILURES:
            decorators.append(DecorateInfo(unittest.expectedFailure, "TestOpInfo", f"test_{test}"))
    op.decorators = tuple(decorators)
    op.skips = ()
    return op


_names = {op.full_name for op in op_db}
_stale = sorted(k for k in (*EXPECTED_FAILURES, *SKIPS, *TOLERANCES) if k[0] not in _names)
assert not _stale, f"EXPECTED_FAILURES/SKIPS/TOLERANCES name ops that are not in op_db: {_stale}"

FORWARD_OPS = [_with_our_decorators(op) for op in op_db if op.supports_dtype(torch.float32, "cpu")]
BACKWARD_OPS = [
    _with_our_decorators(op)
    for op in op_db
    if op.supports_autograd and torch.float32 in op.supported_backward_dtypes("cpu")
]


def _device_type(value):
    """'neuron' / 'cpu' for a device-like argument, else None."""
    if isinstance(value, torch.device):
        return value.type
    if isinstance(value, str) and value.split(":")[0] in ("neuron", "cpu"):
        return value.split(":")[0]
    return None


def _cpu_sample(sample):
    """(input, args, kwargs) of `sample` with every tensor an exact CPU copy and every neuron
    device argument "cpu". Containers keep their types (torch.Size stays torch.Size); a tensor
    passed twice stays one tensor, and tensors sharing a storage share one CPU storage."""
    tensors, storages = {}, {}

    def copy_tensor(t):
        if t.layout != torch.strided or t.is_conj() or t.is_neg():
            c = t.detach().resolve_conj().resolve_neg().to("cpu")
        else:
            st = t.untyped_storage()
            key = (t.device, st.data_ptr(), st.nbytes())
            if key not in storages:
                storages[key] = st.cpu() if st.device.type != "cpu" else st.clone()
            c = torch.empty(0, dtype=t.dtype).set_(storages[key], t.storage_offset(), t.size(), t.stride())
        return c.requires_grad_(t.requires_grad)

    def conv(x):
        if isinstance(x, torch.Tensor):
            if id(x) not in tensors:
                tensors[id(x)] = copy_tensor(x)
            return tensors[id(x)]
        if isinstance(x, torch.Size):
            return x
        if isinstance(x, (list, tuple)):
            items = [conv(v) for v in x]
            return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if _device_type(x) == N:
            return torch.device("cpu") if isinstance(x, torch.device) else "cpu"
        return x

    return conv(sample.input), conv(sample.args), conv(sample.kwargs)


def _flatten(tree):
    """(leaves, structure) of nested lists/tuples/dicts; torch.Size is a leaf. A lean stand-in for
    torch.utils._pytree.tree_flatten, whose generality is costly when every sample's inputs and
    outputs are flattened several times."""
    leaves = []

    def walk(x):
        if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
            return (type(x).__name__, tuple(walk(v) for v in x))
        if isinstance(x, dict):
            return ("dict", tuple((k, walk(v)) for k, v in x.items()))
        leaves.append(x)
        return None

    return leaves, walk(tree)


def _expected_device(sample):
    """Where the op's outputs belong: an explicit device argument wins; else neuron if any input
    tensor is on neuron; else (e.g. `arange(5)`) the default device, cpu."""
    leaves = _flatten((sample.input, sample.args, sample.kwargs))[0]
    for leaf in leaves:
        if _device_type(leaf) is not None and not isinstance(leaf, torch.Tensor):
            return _device_type(leaf)
    return N if any(isinstance(t, torch.Tensor) and t.device.type == N for t in leaves) else "cpu"


def _tensors(tree, requiring_grad=False):
    return [t for t in _flatten(tree)[0]
            if isinstance(t, torch.Tensor) and (t.requires_grad or not requiring_grad)]


def _aliasing(outputs, inputs):
    """For each output tensor, the index of the input tensor whose storage it shares (or -1)."""
    def ptr(t):
        return t.untyped_storage().data_ptr() if t.layout == torch.strided else None

    in_ptrs = [ptr(t) for t in inputs]
    return [
        next((j for j, q in enumerate(in_ptrs) if q is not None and q == ptr(o)), -1)
        if isinstance(o, torch.Tensor) and o.layout == torch.strided and o.untyped_storage().nbytes()
        else -1
        for o in outputs
    ]


def _run(op, sample, inp, args, kwargs):
    sweeps.seed()
    return sample.output_process_fn_grad(op(inp, *args, **kwargs))


def _samples(op, device, requires_grad):
    # What op.sample_inputs(device, dtype, requires_grad) yields, minus its TrackedInputIter
    # wrapper: that one calls torch.manual_seed before each sample and inspect.stack() per
    # iterator (slow, see helpers.sweeps.seed). We seed once; samples are then reproducible all the same.
    sweeps.seed()
    samples = op.sample_inputs_func(op, device, torch.float32, requires_grad)
    for i, sample in enumerate(samples):
        if MAX_SAMPLES and i >= MAX_SAMPLES:
            return
        yield i, sample


def _describe(i, sample):
    return f"sample {i} ({sample.summary()})"


class TestOpInfo(TestCase):
    def _check(self, op, test, neuron, cpu, what, devices, metadata_only=False):
        """`neuron` (a pytree) matches `cpu`; tensor i of `neuron` is on devices[i] (or on the
        device `devices` names, if a str)."""
        n_leaves, n_spec = _flatten(neuron)
        c_leaves, c_spec = _flatten(cpu)
        if n_spec != c_spec:
            self.fail(f"{what}: structure differs:\n{n_spec}\nvs cpu\n{c_spec}")
        rtol, atol = TOLERANCES.get((op.full_name, test), (0.0, 0.0))
        k = 0
        for i, (n, c) in enumerate(zip(n_leaves, c_leaves)):
            where = f"{what}[{i}]"
            if not isinstance(c, torch.Tensor):
                if _device_type(c) is None and not (c == n or (c != c and n != n)):
                    self.fail(f"{where}: {n!r} != {c!r} (cpu)")
                continue
            if not isinstance(n, torch.Tensor):
                self.fail(f"{where}: {type(n)} instead of a tensor")
            device = devices if isinstance(devices, str) else devices[k]
            k += 1
            if n.device.type != device:
                self.fail(f"{where}: on {n.device}, expected {device}")
            meta_n = (n.dtype, n.layout, n.shape, n.requires_grad)
            meta_c = (c.dtype, c.layout, c.shape, c.requires_grad)
            if meta_n != meta_c:
                self.fail(f"{where}: (dtype, layout, shape, requires_grad) {meta_n} != {meta_c} (cpu)")
            if c.layout == torch.strided and c.numel() > 1 and n.stride() != c.stride():
                self.fail(f"{where}: strides {n.stride()} != {c.stride()} (cpu)")
            if metadata_only:
                continue
            n_host, c = n.detach().cpu(), c.detach()
            try:
                if n_host.layout == torch.strided and torch.equal(n_host, c):
                    continue  # the common, fast case
            except (RuntimeError, NotImplementedError):
                pass  # no torch.equal for this dtype (complex32)
            torch.testing.assert_close(
                n_host, c, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m, w=where: f"{w}: {m}"
            )

    @ops(FORWARD_OPS, allowed_dtypes=(torch.float32,))
    def test_forward(self, device, dtype, op):
        with sweeps.one_thread():
            self._forward(device, op)

    @ops(BACKWARD_OPS, allowed_dtypes=(torch.float32,))
    def test_backward(self, device, dtype, op):
        with sweeps.one_thread():
            self._backward(device, op)

    def _forward(self, device, op):
        metadata_only = op.name in METADATA_ONLY
        compared = 0
        for i, sample in _samples(op, device, requires_grad=False):
            what = _describe(i, sample)
            n_in = _tensors((sample.input, sample.args, sample.kwargs))
            in_devices = [t.device.type for t in n_in]
            cinp, cargs, ckwargs = _cpu_sample(sample)
            try:
                c_out = _run(op, sample, cinp, cargs, ckwargs)
            except Exception as e:  # the neuron call must fail the same way
                with self.assertRaises(type(e), msg=f"{what}: raises {type(e).__name__} on CPU ({e})"):
                    _run(op, sample, sample.input, sample.args, sample.kwargs)
                continue
            n_out = _run(op, sample, sample.input, sample.args, sample.kwargs)
            self._check(op, "forward", n_out, c_out, f"{what} output", _expected_device(sample), metadata_only)
            c_in = _tensors((cinp, cargs, ckwargs))
            self._check(op, "forward", n_in, c_in, f"{what} input after the call", in_devices, metadata_only)
            n_alias = _aliasing(_flatten(n_out)[0], n_in)
            c_alias = _aliasing(_flatten(c_out)[0], c_in)
            if n_alias != c_alias:
                self.fail(f"{what}: outputs alias inputs {n_alias}, on CPU {c_alias} (-1: no input)")
            compared += 1
        if not compared:
            self.fail("no sample compared (none, or all raised on CPU): list the op with a reason")

    def _backward(self, device, op):
        compared = 0
        for i, sample in _samples(op, device, requires_grad=True):
            what = _describe(i, sample)
            n_in = _tensors((sample.input, sample.args, sample.kwargs), requiring_grad=True)
            cinp, cargs, ckwargs = _cpu_sample(sample)
            c_in = _tensors((cinp, cargs, ckwargs), requiring_grad=True)
            if not c_in:
                continue
            try:
                c_out = _tensors(_run(op, sample, cinp, cargs, ckwargs), requiring_grad=True)
            except Exception:
                continue  # forward errors are test_forward's business
            n_out = _tensors(_run(op, sample, sample.input, sample.args, sample.kwargs), requiring_grad=True)
            if len(n_out) != len(c_out):
                self.fail(f"{what}: {len(n_out)} outputs require grad, on CPU {len(c_out)}")
            if not c_out:
                continue
            gen = torch.Generator().manual_seed(sweeps.SEED + i)
            c_w = [torch.randn(t.shape, dtype=t.dtype, generator=gen) for t in c_out]
            n_w = [w.to(t.device) for w, t in zip(c_w, n_out)]
            sweeps.seed()
            c_grads = torch.autograd.grad(c_out, c_in, c_w, allow_unused=True)
            sweeps.seed()
            n_grads = torch.autograd.grad(n_out, n_in, n_w, allow_unused=True)
            none_n = [g is None for g in n_grads]
            if none_n != [g is None for g in c_grads]:
                self.fail(f"{what}: unused inputs (None grads) {none_n} differ from CPU")
            self._check(
                op, "backward", [g for g in n_grads if g is not None], [g for g in c_grads if g is not None],
                f"{what} grad", [t.device.type for t, g in zip(n_in, n_grads) if g is not None],
            )
            compared += 1
        if not compared:
            self.fail("no sample compared (no differentiable input/output): list the op with a reason")


instantiate_device_type_tests(TestOpInfo, globals(), only_for=("neuron",))

if __name__ == "__main__":
    run_tests()
