"""Trainium readiness: op tracking, findings (each present in a bad program, absent in a clean one),
the roofline estimate (checked by hand and against torch.utils.flop_counter on CPU), and the ways
users get the report (API, TORCH_NEURONX_REPORT=1, python -m torch_neuronx.run, HTML)."""
import gc
import inspect
import json
import math
import os
import subprocess
import sys
from html.parser import HTMLParser

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import torch_neuronx
from torch_neuronx import diagnostics
from torch_neuronx.trainium import cost_model, time_model
from torch_neuronx.trainium.cost_model import TensorMeta
from torch_neuronx.python_ops import op_classes

from helpers import isolated

N = "neuron"


@pytest.fixture(autouse=True, scope="module")
def forget_compiled_graphs():
    """Compiled functions here capture neuron tensors: free them with this file, not in a later one."""
    yield
    torch._dynamo.reset()
    gc.collect()



def here(offset: int = 0) -> str:
    """'this_file:line' of the caller's line plus ``offset``: where a finding must point."""
    frame = inspect.currentframe().f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno + offset}"


def kinds(report) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in report.findings:
        out.setdefault(f.kind, []).append(f)
    return out


# ---- op tracking -------------------------------------------------------------------------------
def test_executed_and_fallback_ops_and_clear():
    a, b = torch.ones(4, 8, device=N), torch.ones(8, 3, device=N)
    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_executed_ops() == []
    for _ in range(3):
        a @ b
    a + a
    # the results' allocations listed as TorchNeuron's kernels make them, and only listed
    assert torch_neuronx.get_executed_ops() == ["aten::add.Tensor", "aten::empty_strided", "aten::mm"]
    assert diagnostics.get_op_counts() == {"aten::add.Tensor": 1, "aten::mm": 3}
    torch_neuronx.clear_op_tracking()
    a.add_(1)
    a.view(-1)[:3].t()  # in place and views: no memory of their own
    assert torch_neuronx.get_executed_ops() == ["aten::add_.Tensor"]
    assert torch_neuronx.get_fallback_ops() == []
    torch.sort(torch.ones(5, device=N))  # TorchNeuron has no sort kernel: a CPU fallback there
    assert "aten::sort.values_stable" in torch_neuronx.get_executed_ops() or \
        any(op.startswith("aten::sort") for op in torch_neuronx.get_executed_ops())
    assert [op for op in torch_neuronx.get_fallback_ops()] == \
        [op for op in torch_neuronx.get_executed_ops() if op.startswith("aten::sort")]
    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_executed_ops() == [] and torch_neuronx.get_fallback_ops() == []


def test_only_the_tables_ops_are_fallbacks_not_ops_missing_from_the_kernel_list():
    # TorchNeuron's kernel list is read from its registries; attention and the CPU route's own op names
    # are not in it, yet run on a NeuronCore there: listing them as fallbacks would be a false alarm
    q, x = torch.randn(1, 2, 8, 4).to(N), torch.randn(1, 4, 3).to(N)
    torch_neuronx.clear_op_tracking()
    torch.nn.functional.scaled_dot_product_attention(q, q, q)
    torch.nn.functional.group_norm(x, 2)
    assert torch_neuronx.get_executed_ops() and torch_neuronx.get_fallback_ops() == []


def test_backward_ops_are_tracked():
    w = torch.ones(8, 3, device=N, requires_grad=True)
    x = torch.ones(4, 8, device=N)
    torch_neuronx.clear_op_tracking()
    (x @ w).sum().backward()  # backward runs on autograd's neuron thread
    counts = diagnostics.get_op_counts()
    assert counts["aten::mm"] == 2  # forward, and the weight's gradient
    torch.testing.assert_close(w.grad.cpu(), torch.full((8, 3), 4.0))


def test_tracking_can_be_turned_off():
    torch_neuronx.clear_op_tracking()
    torch.ops.neuron._set_op_tracking_level(0)
    try:
        torch.ones(3, device=N) + 1
        assert torch_neuronx.get_executed_ops() == []
    finally:
        torch.ops.neuron._set_op_tracking_level(1)
    with pytest.raises(RuntimeError, match="must be 0 .off., 1 .count ops. or 2"):
        torch.ops.neuron._set_op_tracking_level(5)


def test_signature_counts_exact(collect):
    a, b = torch.ones(4, 8, device=N), torch.ones(8, 3, device=N)
    torch_neuronx.clear_op_tracking()
    for _ in range(3):
        c = a @ b  # one signature, 3 calls
    a[:2] @ b  # a new shape: a second signature (the slice is a view, no op)
    c + c
    c + c  # same signature as the line before
    (c + c.to(torch.bfloat16))  # a new dtype: _to_copy and a mixed-dtype add
    signatures = diagnostics.get_op_signatures()
    assert signatures == {
        "aten::mm(f32[4, 8], f32[8, 3])": 3,
        "aten::mm(f32[2, 8], f32[8, 3])": 1,
        "aten::add.Tensor(f32[4, 3], f32[4, 3])": 2,
        "aten::_to_copy(f32[4, 3])": 1,
        "aten::add.Tensor(f32[4, 3], bf16[4, 3])": 1,
    }
    # NEFFs, as TorchNeuron keys its kernels: both mm signatures fall in one 128-row tile (M=4 and M=2
    # padded to 128), the cast is a copy (no kernel): 3 NEFFs, launched 4 + 2 + 1 times.
    neffs = {(n.name, tuple(n.inputs)): n.launches for n in collect().neffs}
    assert neffs == {("aten::mm", ("f32[128, 8]", "f32[8, 3]")): 4, ("aten::add.Tensor", ("f32[4, 3]", "f32[4, 3]")): 2,
                     ("aten::add.Tensor", ("f32[4, 3]", "bf16[4, 3]")): 1}


def test_mm_is_tiled_by_rows_as_torchneuron_tiles_it():
    """python_ops/jax/config.py, TilingConfig: the largest of 8192..128 rows that fits, the last tile padded."""
    from torch_neuronx.trainium import neff_forecast
    from torch_neuronx.trainium.cost_model import TensorMeta

    assert neff_forecast.mm_tiles(1000) == [512, 256, 128, 128]
    assert neff_forecast.mm_tiles(8192 + 300) == [8192, 256, 128]
    assert neff_forecast.mm_tiles(64) == [128]
    a, b = TensorMeta((1000, 64), torch.float32, N), TensorMeta((64, 32), torch.float32, N)
    neffs = neff_forecast.eager_neffs("aten::mm", (a, b), calls=2)
    assert sorted((n.inputs[0], n.launches) for n in neffs) == [("f32[128, 64]", 4), ("f32[256, 64]", 2),
                                                                 ("f32[512, 64]", 2)]
    # nothing to compile: ops TorchNeuron runs on the CPU, copies, empty inputs
    assert not neff_forecast.eager_neffs("aten::linalg_inv_ex", (a,), 1)
    assert not neff_forecast.eager_neffs("aten::_to_copy", (a,), 1)
    assert not neff_forecast.eager_neffs("aten::add.Tensor", (TensorMeta((0, 3), torch.float32, N),) * 2, 1)


# ---- findings: each in a bad program, none in a clean one ---------------------------------------
def test_float64(collect):
    x = torch.ones(3, device=N, dtype=torch.float32)
    x * 2
    assert "float64" not in kinds(collect())
    y = torch.ones(3, dtype=torch.float64).to(N); site = here()
    y * 2; mul_site = here()
    found = kinds(collect())["float64"]
    assert {f.site for f in found} == {site, mul_site}
    assert {f.site: list(f.ops) for f in found} == {site: ["aten::_to_copy"], mul_site: ["aten::mul.Tensor"]}


def test_int64_out_of_int32_range(collect):
    torch.tensor([5, -7], device=N) + 1
    assert "int64-range" not in kinds(collect())
    big = torch.tensor([2**31], device=N)  # a copy: TorchNeuron moves int64 values as they are
    assert "int64-range" not in kinds(collect())
    big - 1; site = here()  # computed in int32 on Trainium: 2**31 does not fit
    (found,) = kinds(collect())["int64-range"]
    assert found.site == site and "2147483648" in found.details[0]


def test_what_trainiums_eager_rules_refuse_is_found_and_nothing_else(collect):
    """With CPU semantics these run here; under TorchNeuron's eager rules (python_ops/cast_policy.py,
    type_converter_base.py, python_ops/jax/config.py) each raises: a place that would fail."""
    x = torch.randn(2, 3, 8, 8, device=N)
    x.to(torch.float16)  # a cast, layout preserved
    x.clone(memory_format=torch.channels_last)  # clone: not a cast
    cl = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last).to(N)  # preserved, from the CPU
    torch.zeros(0, 3, device=N).sum(1)  # a reduction with an identity
    torch.cat([torch.zeros(2, dtype=torch.float8_e5m2, device=N)] * 2)  # in TorchNeuron's dtype map
    assert not {"layout-change", "unsupported-dtype", "empty-reduction"} & set(kinds(collect())), kinds(collect())
    for _ in range(2):
        x.to(torch.float16)  # the same signature as the next line, which only its strides tell apart
        x.to(memory_format=torch.channels_last); layout_site = here()
    cl.to(memory_format=torch.contiguous_format)  # back to contiguous: fine
    torch.ones(3, dtype=torch.uint16, device=N); dtype_site = here()
    torch.zeros(0, 3, device=N).amax(1); empty_site = here()
    found = kinds(collect())
    (layout,) = found["layout-change"]
    assert (layout.site, layout.ops, layout.count) == (layout_site, {"aten::_to_copy": 2}, 2)
    assert "channels_last" in layout.details[0] and layout.severity == "would-fail"
    (dtype,) = found["unsupported-dtype"]
    assert dtype.site == dtype_site and "uint16" in dtype.details[0] and dtype.severity == "would-fail"
    (empty,) = found["empty-reduction"]
    assert empty.site == empty_site and empty.ops == {"aten::amax": 1}


def test_writing_into_a_non_contiguous_view_is_found_and_nothing_else(collect):
    """TorchNeuron's kernels take contiguous tensors, and an in-place op (or out=) runs its kernel on the
    tensor it writes: its test_add_inplace_non_contiguous_output has x[:, 3].add_(2) raise."""
    x = torch.ones(10, 10, device=N)
    x[3] += 1  # a row: contiguous
    x[:, 3] = 7  # copy_: TorchNeuron's copy takes any strides
    y = x.t().contiguous()
    y.mul_(2)
    x.t_()  # metadata only
    x.t_()
    z = torch.ones(4, 4, dtype=torch.float64, device=N)
    z[:, 1].add_(1)  # 64-bit: narrowed into a fresh tensor, then copied back
    x[:, :0].zero_()  # empty: no kernel runs
    torch.add(x[3], 1, out=x[4])  # a contiguous out=
    fresh = x.t() * 2  # CPU keeps the transposed layout; TorchNeuron's kernel gives a contiguous result
    fresh.add_(1)
    assert "non-contiguous-write" not in kinds(collect()), kinds(collect())
    for _ in range(2):
        x[3] += 1  # the same signature as the next line but for its target's strides
        x[:, 3] += 2; column_site = here()
    x.t().mul_(2); transpose_site = here()
    torch.add(x[:, 1], 1, out=x[:, 2]); out_site = here()
    found = {f.site: f for f in kinds(collect())["non-contiguous-write"]}
    assert set(found) == {column_site, transpose_site, out_site}, found
    assert found[column_site].ops == {"aten::add_.Tensor": 2} and found[column_site].severity == "would-fail"
    assert found[transpose_site].ops == {"aten::mul_.Tensor": 1}
    assert found[out_site].ops == {"aten::add.out": 1}
    assert "(10,)" in found[column_site].details[0]
    cpu = torch.ones(10, 10)  # the values stay CPU's: only the report says where Trainium would fail
    cpu[3] += 1
    cpu[:, 3] = 7
    torch.add(cpu[3], 1, out=cpu[4])
    for _ in range(2):
        cpu[3] += 1
        cpu[:, 3] += 2
    cpu.t().mul_(2)
    torch.add(cpu[:, 1], 1, out=cpu[:, 2])
    assert torch.equal(x.cpu(), cpu)


def test_training_a_rotary_attention_model_writes_into_no_view(collect):
    """Qwen3's backward adds the gradients of its rotary query and key in place into a buffer that CPU's
    kernels leave transposed; TorchNeuron's give it contiguous, so its add_ runs there: no finding."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)).to(N)
    ids = torch.randint(0, 64, (2, 8), device=N)
    model(ids, labels=ids).loss.backward()
    assert "non-contiguous-write" not in kinds(collect()), kinds(collect())


def test_later_calls_of_a_signature_are_checked(collect):
    """The core counts the calls of a known signature and hands Python only those that may make a
    finding: a result dtype or device the non-tensor arguments chose, int64 values out of range."""
    x, ids = torch.ones(3, device=N), torch.tensor([1, 2], device=N)
    for _ in range(3):
        x.to(torch.float16)  # the same inputs as the next lines: only the results differ
    x.to(torch.float64); wide_site = here()
    for _ in range(3):
        x.to("cpu"); cpu_site = here()
    for value in (5, 2**31, 7, 2**40):
        ids + value; add_site = here()  # in range, out, in, out: the same signature each time
    strided = torch.tensor([[1, 2**40], [3, 4]], device=N).t()  # not contiguous: another way to read it
    for _ in range(2):
        strided * 1; strided_site = here()
    found = kinds(collect())
    (wide,) = found["float64"]
    assert (wide.site, wide.ops, wide.count) == (wide_site, {"aten::_to_copy": 1}, 1)
    (sync,) = found["host-sync-in-loop"]
    assert (sync.site, sync.count) == (cpu_site, 3)
    out_of_range = {f.site: f for f in found["int64-range"]}
    assert out_of_range[add_site].count == 2 and "2147483649" in out_of_range[add_site].details[0]
    assert out_of_range[strided_site].count == 2 and "1099511627776" in out_of_range[strided_site].details[0]
    signatures = diagnostics.get_op_signatures()
    assert signatures["aten::_to_copy(f32[3])"] == 7 and signatures["aten::add.Tensor(int64[2])"] == 4


def test_stopped_collection_keeps_its_counts():
    torch_neuronx.clear_op_tracking()
    x = torch.ones(3, device=N)
    diagnostics.start()
    try:
        with diagnostics.phase("first"):
            x + x
            x + x
    finally:
        diagnostics.stop()
    first = diagnostics.observer.last()
    diagnostics.start()  # a new collection counts afresh, in the core
    try:
        x * x
        assert diagnostics.get_op_signatures() == {"aten::mul.Tensor(f32[3], f32[3])": 1}
    finally:
        diagnostics.stop()
        torch_neuronx.clear_op_tracking()
    meta = ((3,), torch.float32, N)
    assert first.phases["first"].calls == {("aten::add.Tensor", (meta, meta)): 2}
    assert first.phases["run"].calls == {}


def test_host_sync_in_a_loop(collect, capsys):
    x = torch.arange(4.0, device=N)
    x.sum().item()  # once, at the end of a program: normal
    assert "host-sync-in-loop" not in kinds(collect())
    for _ in range(3):
        x.sum().item(); item_site = here()
        x.cpu(); cpu_site = here()
        print(x); print_site = here()
    found = {f.site: f for f in kinds(collect())["host-sync-in-loop"]}
    assert found[item_site].count == 3 and found[item_site].ops == {"aten::_local_scalar_dense": 3}
    assert found[cpu_site].count == 3 and found[cpu_site].ops == {"aten::_to_copy": 3}
    assert found[print_site].count >= 3 and any("printing" in d for d in found[print_site].details)
    assert found[item_site].fix.startswith("move .item() out of the loop")
    capsys.readouterr()


def test_device_rng(collect):
    torch.randn(4).to(N)  # drawn on the CPU, then moved: fine
    assert "device-rng" not in kinds(collect())
    torch.randn(4, device=N); site = here()
    report = collect()
    (found,) = kinds(report)["device-rng"]
    assert found.site == site and found.ops == {"aten::normal_": 1}
    assert "create the tensor on the CPU and move it" in found.fix
    assert "cpu-fallback" not in kinds(report)  # one finding per line says it: drawn on the CPU
    (source,) = [s for s in report.sources if s.id in found.sources]
    assert source.name.startswith("TorchNeuron 0.1.0 source") and source.url.startswith("https://")


def test_cpu_fallback_op(collect):
    x = torch.tensor([3.0, 1.0, 2.0], device=N)
    torch.topk(x, 2)
    assert "cpu-fallback" not in kinds(collect())
    values, _ = torch.sort(x); site = here()
    torch.testing.assert_close(values.cpu(), torch.sort(x.cpu()).values)
    report = collect()
    (found,) = kinds(report)["cpu-fallback"]
    assert found.site == site and all(op.startswith("aten::sort") for op in found.ops)
    names = [s.name for s in report.sources if s.id in found.sources]
    assert any(name.startswith("TorchNeuron 0.1.0 source") for name in names) and "topk" in found.fix


def test_recompiles_and_graph_breaks(collect, capsys):
    def clean(x):
        return (x * 2).sin()

    def breaks(x):
        y = x * 2
        print("host work")  # a graph break
        return y.sin()

    first_line = inspect.getsourcelines(breaks)[1]
    compiled = torch.compile(clean, backend=N)
    compiled(torch.ones(4, device=N))
    compiled(torch.ones(4, device=N))
    assert not {"recompile", "graph-break"} & set(kinds(collect()))
    compiled(torch.ones(6, device=N))  # a new shape: a recompile
    torch.compile(breaks, backend=N)(torch.ones(4, device=N))
    found = kinds(collect())
    (recompile,) = found["recompile"]
    assert list(recompile.ops) == ["clean()"] and "size mismatch" in recompile.details[0]
    (graph_break,) = found["graph-break"]
    assert list(graph_break.ops) == ["breaks()"] and "print" in graph_break.details[0]
    assert graph_break.site == f"{__file__}:{first_line + 2}"  # the print() line
    capsys.readouterr()


def test_recompiles_after_a_dynamo_reset_are_found(capsys):
    """Compile ids start again at 0 after torch._dynamo.reset(): a compile made while observing must
    not be taken for one made before, which had the same id."""
    def before(x):
        return x + 1

    def after(x):
        return x * 3

    torch._dynamo.reset()
    torch.compile(before, backend=N)(torch.ones(2, device=N))
    torch.compile(before, backend=N)(torch.ones(3, device=N))  # compile ids 0/0 and 0/1
    torch._dynamo.reset()
    torch_neuronx.clear_op_tracking()
    diagnostics.start()
    try:
        compiled = torch.compile(after, backend=N)
        compiled(torch.ones(2, device=N))
        compiled(torch.ones(3, device=N))  # 0/0 and 0/1 again: the second is a recompile
        found = kinds(diagnostics.report("Trainium2:2"))
    finally:
        diagnostics.stop()
        torch_neuronx.clear_op_tracking()
    (recompile,) = found["recompile"]
    assert list(recompile.ops) == ["after()"]


def test_inductor_on_neuron(collect):
    def double_sin(x):
        return (x * 2).sin()

    x = torch.ones(4, device=N)
    torch.compile(double_sin, backend=N)(x)  # the neuron backend: fine
    torch.compile(double_sin)(torch.ones(4))  # Inductor on CPU tensors: fine
    assert "inductor-on-neuron" not in kinds(collect())
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match='backend="neuron"'):
        site = here(1)
        torch.compile(double_sin)(x)  # Inductor, the default backend, on neuron tensors
    (found,) = kinds(collect())["inductor-on-neuron"]
    assert found.site == site and list(found.ops) == ['torch.compile(backend="inductor")'] and found.count == 1
    assert 'compile with backend="neuron"' in str(collect())  # the text report names the fix


def test_inductor_on_neuron_error_without_diagnostics():
    from torch_neuronx.interop.ecosystem_errors import InductorOnNeuronError

    assert diagnostics.observer.active() is None
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as caught:
        torch.compile(lambda x: x + 1)(torch.ones(2, device=N))
    assert isinstance(caught.value.inner_exception, InductorOnNeuronError)


def test_safetensors_device(collect, tmp_path):
    import safetensors
    import safetensors.torch

    path = str(tmp_path / "w.safetensors")
    safetensors.torch.save_file({"w": torch.arange(6.0)}, path)
    safetensors.torch.load_file(path, device="cpu")["w"].to(N)  # the working paths
    safetensors.torch.load_file(path, device=0)
    with safetensors.safe_open(path, framework="pt", device="cpu") as f:
        f.get_tensor("w")
    assert "safetensors-device" not in kinds(collect())
    with pytest.raises(Exception, match="device neuron is invalid"):  # safetensors' own error, unchanged
        site = here(1)
        safetensors.torch.load_file(path, device="neuron")
    with pytest.raises(Exception, match="is invalid"):
        open_site = here(1)
        safetensors.safe_open(path, framework="pt", device="neuron:0")
    found = {f.site: f for f in kinds(collect())["safetensors-device"]}
    assert set(found) == {site, open_site}
    assert list(found[site].ops) == ["safetensors.torch.load_file(device='neuron')"] and found[site].count == 1
    assert list(found[open_site].ops) == ["safetensors.safe_open(device='neuron:0')"]
    assert "load to CPU" in str(collect())


def test_safetensors_unwatched_after_stop():
    import safetensors.torch

    diagnostics.start()
    assert hasattr(safetensors.torch.load_file, "__neuron_watched__")
    diagnostics.stop()
    assert not hasattr(safetensors.torch.load_file, "__neuron_watched__")
    assert not hasattr(safetensors.safe_open, "__neuron_watched__")


def test_memory_against_hbm():
    code = """
        import torch, torch_neuronx
        from torch_neuronx import diagnostics
        diagnostics.start()
        x = torch.empty(int(SIZE), dtype=torch.uint8, device="neuron")  # pages are never touched
        print([f.kind + ":" + "; ".join(f.details) for f in diagnostics.report().findings
               if f.kind == "memory"])
        """
    # trn1.2xlarge at LNC=1: a core has 16 GiB of HBM, minus the runtime's reservation.
    env = dict(TORCH_NEURONX_INSTANCE_TYPE="trn1.2xlarge", TORCH_NEURONX_DEVICE_MEMORY="40GiB")
    big = isolated.run(code.replace("SIZE", str(17 * 2**30)), **env)
    assert big.returncode == 0, big.stderr
    assert "exceeds" in big.stdout and "would run out of memory" in big.stdout
    small = isolated.run(code.replace("SIZE", str(2**20)), **env)
    assert small.returncode == 0, small.stderr
    assert small.stdout.strip() == "[]"


# ---- the estimate ------------------------------------------------------------------------------
def test_profile_numbers():
    p = cost_model.profile_for("Trainium2", 2)  # a quarter of the chip
    assert math.isclose(p.bf16_tflops, 166.75) and math.isclose(p.fp32_tflops, 45.25)
    assert math.isclose(p.hbm_tb_per_s, 0.725)
    p1 = cost_model.profile_for("Trainium2", 1)
    assert math.isclose(p1.bf16_tflops, 667 / 8) and math.isclose(p1.hbm_tb_per_s, 2.9 / 8)
    with pytest.raises(ValueError, match="no cost profile for chip 'Trainium9'"):
        cost_model.profile_for("Trainium9", 2)
    assert cost_model.parse_profile("Trainium3:1") == cost_model.profile_for("Trainium3", 1)
    assert cost_model.parse_profile("Trainium2") == p
    with pytest.raises(ValueError, match="CHIP:LNC, e.g. Trainium2:2; got 'Trainium2:x'"):
        cost_model.parse_profile("Trainium2:x")
    with pytest.raises(ValueError, match="LNC 3 is not valid for Trainium2: valid values on Trainium2 are 2 or 1"):
        cost_model.parse_profile("Trainium2:3")
    # one LNC check, the hardware table's: Trainium (trn1) takes LNC=1 only, and defaults to it
    with pytest.raises(ValueError, match="valid values on Trainium are 1"):
        cost_model.profile_for("Trainium", 2)
    assert cost_model.parse_profile("Trainium").lnc == 1


def test_matmul_estimate_by_hand():
    p = cost_model.profile_for("Trainium2", 2)
    cal = time_model.CALIBRATION
    m = k = n = 1024
    a, b = TensorMeta((m, k), torch.bfloat16, N), TensorMeta((k, n), torch.bfloat16, N)
    out = TensorMeta((m, n), torch.bfloat16, N)
    cost = time_model.op_cost(p, "aten::mm", (a, b), (out,))
    assert cost.flops == 2 * 1024**3 == 2_147_483_648
    assert cost.bytes == 3 * 1024 * 1024 * 2 == 6_291_456
    # compute: 2.147e9 / (166.75e12 x the compute fraction); memory: 6.29e6 / (0.725e12 x the bandwidth
    # fraction): at 60% and 50%, 21.5 us against 17.4 us -> compute-bound
    assert cost.bound == "compute"
    assert math.isclose(cost.seconds, 2_147_483_648 / (166.75e12 * cal.compute_fraction))
    small = time_model.op_cost(p, "aten::mm", (TensorMeta((128, 256), torch.bfloat16, N),
                                               TensorMeta((256, 64), torch.bfloat16, N)),
                               (TensorMeta((128, 64), torch.bfloat16, N),))
    assert small.bound == "memory" and math.isclose(
        small.seconds, (128 * 256 + 256 * 64 + 128 * 64) * 2 / (0.725e12 * cal.hbm_fraction))


def test_elementwise_estimate_by_hand():
    p = cost_model.profile_for("Trainium2", 2)
    x = TensorMeta((1000, 1000), torch.float32, N)
    cost = time_model.op_cost(p, "aten::add.Tensor", (x, x), (x,))
    assert cost.flops == 0 and cost.bytes == 12_000_000  # two reads and a write of 4 MB
    assert math.isclose(cost.seconds, 12e6 / (0.725e12 * time_model.CALIBRATION.hbm_fraction))
    inplace = time_model.op_cost(p, "aten::add_.Tensor", (x, x), ())
    assert inplace.bytes == 12_000_000  # the first argument is also written


def test_a_gather_reads_its_rows_and_a_scatter_writes_its_source():
    p = cost_model.profile_for("Trainium2", 2)
    table, rows = TensorMeta((128256, 4096), torch.bfloat16, N), TensorMeta((8, 4096), torch.bfloat16, N)
    index = TensorMeta((8,), torch.int64, N)
    gather = time_model.op_cost(p, "aten::embedding", (table, index), (rows,))
    assert gather.bytes == 8 * 8 + 2 * 8 * 4096 * 2  # the indices, the rows read and written; not the table
    cache, new = TensorMeta((1, 8, 4096, 128), torch.bfloat16, N), TensorMeta((1, 8, 1, 128), torch.bfloat16, N)
    update = time_model.op_cost(p, "aten::index_copy_", (cache, index, new), ())
    assert update.bytes == 2 * (8 * 8 + 8 * 128 * 2)


def test_estimate_of_a_run(collect):
    a = torch.ones(1024, 1024, dtype=torch.bfloat16, device=N)
    x = torch.ones(1000, 1000, device=N)
    torch_neuronx.clear_op_tracking()
    with diagnostics.phase("matmul"):
        a @ a
    with diagnostics.phase("elementwise"):
        x + x
    report = collect()
    phases = {p.name: p for p in report.phases}
    cal = time_model.CALIBRATION
    assert math.isclose(phases["matmul"].estimated_ms, 2_147_483_648 / (166.75e12 * cal.compute_fraction) * 1e3)
    assert math.isclose(phases["elementwise"].estimated_ms, 12e6 / (0.725e12 * cal.hbm_fraction) * 1e3)
    families = {f.family: f for f in report.families}
    assert families["matmul"].flops == 2_147_483_648 and families["matmul"].bound == "compute"
    assert families["elementwise"].bytes == 12_000_000 and families["elementwise"].bound == "memory"
    assert math.isclose(report.estimated_ms, phases["matmul"].estimated_ms + phases["elementwise"].estimated_ms)
    assert "ESTIMATED" in str(report) and "not a measurement" in str(report)


def _flop_program(device):
    g = torch.Generator().manual_seed(0)
    t = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    x, w = t(4, 16), t(16, 8)
    x @ w
    torch.addmm(t(8), x, w)
    torch.bmm(t(3, 4, 16), t(3, 16, 5))
    F.conv2d(t(2, 3, 9, 9), t(6, 3, 3, 3), padding=1)
    F.conv_transpose2d(t(2, 6, 5, 5), t(6, 3, 3, 3), stride=2)
    F.linear(x, t(8, 16), t(8))


def test_flops_follow_torch_flop_counter(collect):
    with FlopCounterMode(display=False) as counter:
        _flop_program("cpu")
    torch_neuronx.clear_op_tracking()
    _flop_program(N)
    ours = sum(f.flops for f in collect().families)
    assert ours == counter.get_total_flops() > 0


def test_attention_flops(collect):
    b, h, s, d = 2, 4, 32, 16
    q = torch.ones(b, h, s, d, device=N)
    torch_neuronx.clear_op_tracking()
    F.scaled_dot_product_attention(q, q, q)
    (attention,) = [f for f in collect().families if f.family == "attention"]
    assert attention.flops == 4 * b * h * s * s * d  # QK^T and PV, 2 FLOPs per multiply-add


def test_compiled_graphs_are_costed_per_call(collect):
    w = torch.ones(64, 64, device=N)
    fn = torch.compile(lambda x: F.gelu(x @ w), backend=N, fullgraph=True)
    x = torch.ones(32, 64, device=N)
    with diagnostics.phase("compiled"):
        fn(x)
        fn(x)
    report = collect()
    (graph,) = report.compiled_graphs
    assert graph.calls == 2 and graph.ops >= 2 and not graph.error
    (phase,) = [p for p in report.phases if p.name == "compiled"]
    assert phase.compiled_graph_calls == 2 and phase.eager_calls == 0
    matmul = [f for f in phase.families if f.family == "matmul"][0]
    assert matmul.flops == 2 * (2 * 32 * 64 * 64)
    # One fused NEFF per call: x and w read, gelu's result written; x @ w stays on chip.
    assert sum(f.bytes for f in phase.families) == 2 * (32 * 64 + 64 * 64 + 32 * 64) * 4


def test_a_training_graphs_backward_is_costed_at_each_backward_call(collect):
    w = torch.ones(64, 64, device=N, requires_grad=True)
    fn = torch.compile(lambda x: (x @ w).sum(), backend=N, fullgraph=True)
    x = torch.ones(32, 64, device=N)
    with diagnostics.phase("train"):
        for _ in range(3):
            fn(x).backward()
    with diagnostics.phase("forward only"):
        fn(x)
    report = collect()
    graphs = {g.name: g for g in report.compiled_graphs}
    [name] = [n for n in graphs if not n.endswith(".backward")]
    assert graphs[name].calls == 4 and graphs[f"{name}.backward"].calls == 3
    matmul_flops = 2 * 32 * 64 * 64  # the forward's x @ w, and the backward's x.T @ grad (x needs none)
    phases = {p.name: p for p in report.phases}
    train, forward_only = phases["train"], phases["forward only"]
    assert train.compiled_graph_calls == 6 and forward_only.compiled_graph_calls == 1
    assert [f.flops for f in train.families if f.family == "matmul"] == [6 * matmul_flops]
    assert [f.flops for f in forward_only.families if f.family == "matmul"] == [matmul_flops]


# ---- how users get it --------------------------------------------------------------------------
def test_report_api(collect):
    torch.ones(2, 2, device=N).double()
    report = collect()
    assert isinstance(report, diagnostics.Report) and report.collected
    data = json.loads(report.to_json())
    assert data["profile"]["chip"] == "Trainium2" and data["findings"][0]["kind"] == "float64"
    text = str(report)
    assert "Trainium readiness report" in text and "[float64]" in text and "Assumptions" in text


def test_report_without_collection_says_so():
    diagnostics.stop()
    torch_neuronx.clear_op_tracking()
    torch.ones(2, device=N) + 1
    report = torch_neuronx.report()
    # torch.ones is aten::ones, tracked under its name as TorchNeuron tracks it (not its fill_)
    assert not report.collected and report.executed_ops == {"aten::add.Tensor": 1, "aten::ones": 1}
    assert "not observed" in report.assumptions[0]


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_env_var_prints_report_at_exit():
    code = """
        import torch
        x = torch.ones(3, dtype=torch.float64, device="neuron") * 2
        print("done")
        """
    on = isolated.run(code, TORCH_NEURONX_REPORT="1")
    assert on.returncode == 0, on.stderr
    assert on.stdout.strip() == "done"
    assert "Trainium readiness report" in on.stderr and "[float64]" in on.stderr and "mul x1" in on.stderr
    assert on.stderr.splitlines()[1].startswith("Verdict (ready with changes): 0 places would fail on Trainium, "
                                                "1 computes differently")
    off = isolated.run(code)
    assert "Trainium readiness report (" not in off.stderr
    bad = isolated.run(code, TORCH_NEURONX_REPORT="maybe")
    assert bad.returncode == 0 and "TORCH_NEURONX_REPORT='maybe' is not a boolean" in bad.stderr
    assert "Trainium readiness report (" not in bad.stderr


SCRIPT = """
import sys
import torch
x = torch.ones(8, 8, device="neuron")
for step in range(3):
    y = x @ x
    print("loss", y.sum().item())
print("args", sys.argv[1:])
sys.exit(int(sys.argv[1]))
"""


def _run_wrapper(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "torch_neuronx.run", *args], capture_output=True, text=True,
                          env=isolated.environment(), cwd=tmp_path, timeout=300)


def test_run_wrapper_writes_text_json_html(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    result = _run_wrapper(tmp_path, "--output-dir", str(out), str(script), "3", "--flag")
    assert result.returncode == 3, result.stderr
    assert "args ['3', '--flag']" in result.stdout
    data = json.loads((out / "report.json").read_text())
    (sync,) = [f for f in data["findings"] if f["kind"] == "host-sync-in-loop"]
    assert sync["site"] == f"{script}:7" and sync["count"] == 3
    assert (out / "report.txt").read_text().startswith("Trainium readiness report")
    assert "Report written to" in result.stderr
    _check_html((out / "report.html").read_text(), data)


def test_run_wrapper_errors(tmp_path):
    missing = _run_wrapper(tmp_path, "nope.py")
    assert missing.returncode == 2 and "no such script: nope.py" in missing.stderr
    (tmp_path / "ok.py").write_text("print('ran')")
    bad_profile = _run_wrapper(tmp_path, "--profile", "Trainium9:2", "ok.py")
    assert bad_profile.returncode == 2 and "no cost profile for chip 'Trainium9'" in bad_profile.stderr
    module = _run_wrapper(tmp_path, "--output-dir", "r", "-m", "json.tool", "--help")  # --help is json.tool's
    assert module.returncode == 0 and "json.tool" in module.stdout
    assert (tmp_path / "r" / "report.html").exists()


class _Checker(HTMLParser):
    VOID = {"meta", "br", "img", "input", "link", "hr", "rect", "line", "polyline"}

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _check_html(page: str, data: dict) -> None:
    assert page.startswith("<!DOCTYPE html>")
    checker = _Checker()
    checker.feed(page)
    assert checker.errors == [] and checker.stack == []
    text = " ".join(checker.text)
    top = [f["family"] for f in data["families"] if f["bound"] != "not estimated"][:2]
    assert top and all(name in text for name in top)
    assert page.count("<svg") == 2 and "<polyline" in page  # the family chart and the memory timeline
    assert "estimates" in text


def test_html_of_a_report(collect, tmp_path):
    x = torch.ones(256, 256, device=N)
    for _ in range(20):
        x = torch.softmax(x @ x, dim=-1)
    paths = diagnostics.write(collect(), str(tmp_path))
    from pathlib import Path

    page = Path(paths["html"]).read_text()
    _check_html(page, json.loads(Path(paths["json"]).read_text()))
    assert {"matmul", "softmax"} <= {f.family for f in collect().families}
    assert os.path.getsize(paths["txt"]) > 0


def test_findings_inside_compiled_graphs_point_at_the_user_line(collect):
    def clean(x):
        return (x * 2).sin()

    def wide(x):
        return x.double() * 2

    torch.compile(clean, backend=N, fullgraph=True)(torch.ones(4, device=N))
    assert not {"float64", "cpu-fallback", "device-rng"} & set(kinds(collect()))
    torch.compile(wide, backend=N, fullgraph=True)(torch.ones(4, device=N))
    found = kinds(collect())["float64"]
    line = inspect.getsourcelines(wide)[1] + 1
    assert {f.site for f in found} == {f"{__file__}:{line}"}
    assert all(d.startswith("in a compiled graph") for f in found for d in f.details)


def test_backward_calls_name_the_backward_node(collect):
    w = torch.ones(3, device=N, dtype=torch.float64, requires_grad=True)
    torch_neuronx.clear_op_tracking()
    line = sys._getframe().f_lineno + 1
    (w * 2).sum().backward()  # runs on this thread, as on CPU: the node and this line are named
    rows = {f.site: f for f in kinds(collect())["float64"]}
    assert any(c.startswith("backward (") and "Backward" in c for c in rows[f"{__file__}:{line}"].context), rows


def test_collectives_are_counted_not_estimated():
    assert op_classes.family("c10d::allreduce_") == "collective"
    assert op_classes.family("aten::mm") == "matmul" and op_classes.family("aten::normal_") == "random"
    assert op_classes.family("aten::native_dropout") == "random" and op_classes.family("aten::add.Tensor") == \
        "elementwise"


def test_dropout_runs_on_neuron_for_op_tracking_as_torchneurons_kernel():
    # TorchNeuron's native_dropout kernel draws its mask on the CPU, yet is its own op (test_native_dropout)
    x = torch.ones(8, device=N)
    torch_neuronx.clear_op_tracking()
    torch.nn.functional.dropout(x, 0.5, training=True)
    assert "aten::native_dropout" in torch_neuronx.get_executed_ops()
    assert "aten::native_dropout" not in torch_neuronx.get_fallback_ops()
