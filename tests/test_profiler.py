"""torch.profiler on neuron: ops recorded (names, input shapes), Chrome trace export, the
PrivateUse1 activity, and the same op names as the same code on CPU."""
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from helpers.oracle import assert_same

N = "neuron"
# Non-square, all different: a wrong or swapped shape is visible.
A_SHAPE, B_SHAPE = (8, 16), (16, 4)
COMPUTE = ("mm", "matmul", "add", "softmax")  # the op names of the compute ops run below


def run_ops(a, b):
    """A matmul, an add and a softmax; returns every result."""
    c = a @ b
    d = c + 1
    return c, d, torch.softmax(d, -1)


def inputs(device):
    torch.manual_seed(0)
    return torch.randn(A_SHAPE).to(device), torch.randn(B_SHAPE).to(device)


def profiled(device, **kwargs):
    """Profile run_ops on ``device`` (CPU activity unless given); returns (profile, results)."""
    a, b = inputs(device)
    run_ops(a, b)  # warm-up: lazy initialization stays out of the profile
    kwargs.setdefault("activities", [ProfilerActivity.CPU])
    with profile(**kwargs) as prof:
        results = run_ops(a, b)
    return prof, results


def op_names(prof):
    return {e.key for e in prof.key_averages()}


def compute_ops(names):
    """The aten ops among ``names`` that belong to the matmul, the add or the softmax."""
    return {n for n in names if n.startswith("aten::") and any(c in n.split("::", 1)[1] for c in COMPUTE)}


def test_profiler_records_neuron_ops():
    """The CPU activity records the matmul, add and softmax run on neuron tensors, each once."""
    prof, results = profiled(N)
    assert all(r.device.type == "neuron" for r in results)
    counts = {e.key: e.count for e in prof.key_averages()}
    for name in ("aten::mm", "aten::add", "aten::softmax"):
        assert counts.get(name) == 1, f"{name} not recorded once: {sorted(counts)}"
    assert_same(list(results), list(run_ops(*inputs("cpu"))), exact=False, rtol=1e-6, atol=1e-6)


def test_profiler_records_input_shapes():
    """With record_shapes=True, aten::mm is recorded with the shapes of its two inputs."""
    prof, _ = profiled(N, record_shapes=True)
    mm_shapes = [e.input_shapes for e in prof.key_averages(group_by_input_shape=True) if e.key == "aten::mm"]
    assert mm_shapes == [[list(A_SHAPE), list(B_SHAPE)]]
    softmax_shapes = [e.input_shapes for e in prof.key_averages(group_by_input_shape=True)
                      if e.key == "aten::softmax"]
    assert softmax_shapes == [[[A_SHAPE[0], B_SHAPE[1]], [], []]]


def test_chrome_trace_export(tmp_path):
    """export_chrome_trace writes JSON whose traceEvents hold complete ("X") aten::mm events with
    their input dims, as Perfetto and chrome://tracing load them."""
    prof, _ = profiled(N, record_shapes=True)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert isinstance(events, list)
    mm = [e for e in events if e.get("name") == "aten::mm"]
    assert len(mm) == 1
    assert mm[0]["ph"] == "X" and mm[0]["dur"] >= 0 and "ts" in mm[0]
    assert mm[0]["args"]["Input Dims"] == [list(A_SHAPE), list(B_SHAPE)]
    names = {e.get("name") for e in events if e.get("ph") == "X"}
    assert {"aten::add", "aten::softmax"} <= names


def test_privateuse1_activity_is_accepted():
    """ProfilerActivity.PrivateUse1 (shown as NEURON) is a supported activity; with CPU it profiles
    without error and still records the neuron ops."""
    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()
    prof, results = profiled(N, activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])
    assert all(r.device.type == "neuron" for r in results)
    assert {"aten::mm", "aten::add", "aten::softmax"} <= op_names(prof)


@pytest.mark.parametrize("record_shapes", [False, True])
def test_same_compute_ops_as_cpu(record_shapes):
    """The same code profiled on CPU and on neuron records the same aten op names for the matmul,
    the add and the softmax (and the same number of calls of each)."""
    cpu_prof, _ = profiled("cpu", record_shapes=record_shapes)
    neuron_prof, _ = profiled(N, record_shapes=record_shapes)
    cpu_ops = compute_ops(op_names(cpu_prof))
    assert {"aten::mm", "aten::add", "aten::softmax"} <= cpu_ops  # the filter keeps the compute ops
    assert compute_ops(op_names(neuron_prof)) == cpu_ops
    counts = lambda prof: {e.key: e.count for e in prof.key_averages() if e.key in cpu_ops}  # noqa: E731
    assert counts(neuron_prof) == counts(cpu_prof)
