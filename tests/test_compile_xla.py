"""Faithful compiled mode: TorchNeuron's front end (FX -> torch-mlir -> StableHLO) and the ``xla``
executor (XLA:CPU), its errors, artifacts, cache, TorchNeuron's device rules for compiled graphs
and the readiness report's StableHLO lowering. CPU eager is the oracle; the ``xla`` executor is
compared within float32 tolerances (see ``FLOAT32``); the default ``inductor`` one is compared with the
same function compiled by Inductor on CPU, exactly."""
import copy
import inspect
import os
import re

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from torch_neuronx import neuron_dynamo_backend as backend
from torch_neuronx.neuron_dynamo_backend import NEFFCompilationError
from torch_neuronx.neuron_dynamo_backend import faithful as front_end
from torch_neuronx.neuron_dynamo_backend.faithful import lowering
from torch_neuronx.neuron_dynamo_backend.executors import xla_program

from helpers import isolated
from helpers.oracle import assert_same, inductor_on_cpu

pytestmark = pytest.mark.usefixtures("fresh_compile")

N = "neuron"
EXECUTOR_ENV = "TORCH_NEURONX_COMPILE_EXECUTOR"
# XLA:CPU sums dot products and reductions in its own order (its own GEMM blocking, fused
# reductions), so float32 results differ from ATen's by reassociation only: a few ulps of the
# partial sums. The models here have fan-ins of at most 64 and values of order 1, so a relative
# error of 1e-5 (about 80 float32 ulps) and an absolute one of 1e-6 (for values near zero) bound
# it while any wrong op (a dropped bias, a wrong transpose, float64 narrowed where it should not
# be) is orders of magnitude larger.
FLOAT32 = {"rtol": 1e-5, "atol": 1e-6}
# Gradients go through two matmuls more (and the loss's mean over the batch): a little more room.
FLOAT32_GRADS = {"rtol": 1e-5, "atol": 1e-5}
TIMESTAMP = r"\d{8}_\d{6}_\d{6}"


def here(offset: int = 0) -> str:
    """'this_file:line' of the caller's line plus ``offset``: where an error or finding must point."""
    frame = inspect.currentframe().f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno + offset}"


@pytest.fixture
def xla_compiles(monkeypatch):
    """Counts XLA compilations: proof that a graph really ran through the xla executor."""
    calls = []
    real = xla_program.compile_program

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(xla_program, "compile_program", counted)
    return calls


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """Each test starts from TorchNeuron's defaults for the variables this file is about."""
    for name in (EXECUTOR_ENV, "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "TORCH_NEURONX_DEBUG_DIR",
                 "TORCH_NEURONX_RETAIN_DEVICE_MODE", "TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY",
                 "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "NEURON_CC_FLAGS", "TORCH_NEURONX_REPORT"):
        monkeypatch.delenv(name, raising=False)


def compile_xla(fn, way, monkeypatch, **options):
    """``fn`` compiled by the neuron backend with the xla executor chosen ``way`` ("env" or "option")."""
    if way == "env":
        monkeypatch.setenv(EXECUTOR_ENV, "xla")
        return torch.compile(fn, backend="neuron", options=options or None)
    return torch.compile(fn, backend="neuron", options={"executor": "xla", **options})


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


def assert_compiled():
    metrics = backend.get_dynamo_metrics()
    assert metrics and not any(m["fell_back"] for m in metrics)


# ---- the xla executor against CPU eager ---------------------------------------------------------
@pytest.mark.parametrize("way", ["env", "option"])
def test_mlp_forward_and_training_step_match_cpu(way, monkeypatch, xla_compiles):
    model = mlp()
    x, target = torch.randn(4, 16), torch.randn(4, 8)
    with torch.no_grad():
        expected = model(x)
    F.mse_loss(model(x), target).backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]

    neuron_model = mlp().to(N)
    compiled = compile_xla(neuron_model, way, monkeypatch)
    with torch.no_grad():
        assert_same(compiled(x.to(N)), expected, **FLOAT32)
    loss = F.mse_loss(compiled(x.to(N)), target.to(N))
    loss.backward()
    assert_same(loss.detach(), F.mse_loss(expected, target), **FLOAT32)
    assert_same([p.grad for p in neuron_model.parameters()], expected_grads, **FLOAT32_GRADS)
    assert_compiled()
    # inference forward, training forward and its backward: three programs, all XLA's
    assert len(xla_compiles) == 3


def encoder_layer():
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                            batch_first=True).eval()


@pytest.mark.parametrize("way", ["env", "option"])
def test_transformer_encoder_layer_forward_matches_cpu(way, monkeypatch, xla_compiles):
    layer, x = encoder_layer(), torch.randn(2, 5, 32)
    expected = layer(x)
    out = compile_xla(copy.deepcopy(layer).to(N), way, monkeypatch)(x.to(N))
    assert_same(out.detach(), expected.detach(), **FLOAT32)
    assert_compiled()
    assert xla_compiles


def test_transformer_encoder_layer_fast_path_does_not_lower(monkeypatch):
    """Under no_grad an eval TransformerEncoderLayer takes PyTorch's fast path (neuron is one of its
    devices): one fused op, aten._transformer_encoder_layer_fwd, that neither torch nor TorchNeuron
    decomposes and torch-mlir does not lower. TorchNeuron's compile stops there, so the xla executor
    does too, naming the op and the stage; the default executor runs it like CPU."""
    layer, x = encoder_layer(), torch.randn(2, 5, 32)
    with torch.no_grad():
        expected = inductor_on_cpu(copy.deepcopy(layer))(x)
        with pytest.raises(Exception) as raised:
            compile_xla(copy.deepcopy(layer).to(N), "option", monkeypatch)(x.to(N))
        torch._dynamo.reset()
        out = torch.compile(copy.deepcopy(layer).to(N), backend="neuron")(x.to(N))
    message = str(raised.value)
    assert "_transformer_encoder_layer_fwd" in message and re.search(r"stage: (import|torch-backend)", message)
    assert_same(out, expected)


def test_compiled_optimizer_step_updates_neuron_parameters_like_cpu(monkeypatch, xla_compiles):
    def run(device, step_fn=None):
        model = mlp().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
        step = step_fn(opt.step) if step_fn else opt.step
        torch.manual_seed(1)
        for _ in range(2):
            for p in model.parameters():
                p.grad = torch.randn(p.shape).to(device)
            step()
        return list(model.parameters())

    expected = run("cpu")
    params = run(N, lambda step: compile_xla(step, "option", monkeypatch))
    # elementwise updates only (no reassociation): float32 rounding of the same operations
    assert_same([p.detach() for p in params], [p.detach() for p in expected], **FLOAT32)
    assert not any(torch.equal(p.detach().cpu(), q.detach()) for p, q in zip(params, mlp().parameters()))
    assert_compiled()
    assert xla_compiles


# ---- float64 is computed as float32 under xla ---------------------------------------------------
def test_float64_computes_as_float32_under_xla_and_as_float64_under_inductor(monkeypatch):
    def absorb(t):
        return (t + 1e8) - 1e8

    expected = absorb(torch.ones(3, dtype=torch.float64))
    assert torch.equal(expected, torch.ones(3, dtype=torch.float64))

    default = torch.compile(absorb, backend="neuron")(torch.ones(3, dtype=torch.float64, device=N))
    assert_same(default, expected)

    torch._dynamo.reset()
    faithful = compile_xla(absorb, "option", monkeypatch)(torch.ones(3, dtype=torch.float64, device=N))
    assert faithful.device.type == N and faithful.dtype == torch.float64
    # 1e8 + 1 is not a float32: it rounds to 1e8, as on Trainium
    assert torch.equal(faithful.cpu(), torch.zeros(3, dtype=torch.float64))


# ---- comparisons of unsigned and boolean tensors ---------------------------------------------------
def test_unsigned_and_boolean_comparisons_order_as_on_cpu(monkeypatch):
    """torch-mlir marks them SIGNED (200 as a ui8 would be below 100); the executor runs them unsigned."""
    def compare(pixels, mask):
        return (pixels < 100), (pixels >= 128) == mask, mask > (pixels == 5)

    pixels = torch.tensor([1, 5, 200, 100, 255], dtype=torch.uint8)
    mask = torch.tensor([True, False, True, False, True])
    expected = compare(pixels, mask)
    got = compile_xla(compare, "option", monkeypatch)(pixels.to(N), mask.to(N))
    for g, e in zip(got, expected):
        assert torch.equal(g.cpu(), e)


def test_special_functions_with_a_scalar_argument_compute_as_on_cpu(monkeypatch):
    def special(q):
        return torch.special.zeta(2.0, q), torch.special.zeta(q + 1, 3.0), torch.lgamma(q) + torch.digamma(q)

    q = torch.rand(5, generator=torch.Generator().manual_seed(0)) + 0.5
    got = compile_xla(special, "option", monkeypatch)(q.to(N))
    for g, e in zip(got, special(q)):
        assert_same(g, e, **FLOAT32)


# ---- an op that does not lower ------------------------------------------------------------------
def rfft_site_and_function():
    def spectrum(x):
        return torch.fft.rfft(x) * 2
    return f"{__file__}:{inspect.getsourcelines(spectrum)[1] + 1}", spectrum


def test_rfft_under_xla_raises_naming_op_stage_and_line(monkeypatch):
    site, spectrum = rfft_site_and_function()
    with pytest.raises(Exception) as raised:
        compile_xla(spectrum, "env", monkeypatch)(torch.randn(8, device=N))
    chain, error = [], raised.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or getattr(error, "inner_exception", None)
    assert any(isinstance(e, NEFFCompilationError) for e in chain), chain
    message = str(raised.value)
    assert "aten._fft_r2c" in message and site in message
    assert re.search(r"stage: (import|torch-backend|stablehlo)", message), message


def test_rfft_under_xla_with_fallback_warns_and_runs_eagerly(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "0")
    _, spectrum = rfft_site_and_function()
    x = torch.randn(8)
    with pytest.warns(RuntimeWarning, match="_fft_r2c"):
        out = compile_xla(spectrum, "env", monkeypatch)(x.to(N))
    assert_same(out, spectrum(x))
    assert backend.get_dynamo_metrics()[0]["fell_back"]


# ---- bad settings -------------------------------------------------------------------------------
def test_bad_executor_in_env_names_variable_and_choices(monkeypatch):
    monkeypatch.setenv(EXECUTOR_ENV, "tpu")
    with pytest.raises(Exception, match=EXECUTOR_ENV) as raised:
        torch.compile(lambda t: t + 1, backend="neuron")(torch.ones(2, device=N))
    assert "'tpu'" in str(raised.value) and "'inductor'" in str(raised.value) and "'xla'" in str(raised.value)


def test_bad_executor_option_names_option_and_choices():
    with pytest.raises(Exception, match="executor") as raised:
        torch.compile(lambda t: t + 1, backend="neuron", options={"executor": "gpu"})(torch.ones(2, device=N))
    message = str(raised.value)
    assert "options={'executor'" in message and "'gpu'" in message
    assert "'inductor'" in message and "'xla'" in message


def test_bad_compiler_args_type_is_an_error():
    with pytest.raises(Exception, match="compiler_args") as raised:
        torch.compile(lambda t: t + 1, backend="neuron", options={"compiler_args": 2})(torch.ones(2, device=N))
    assert "list of strings" in str(raised.value)


# ---- artifacts in TorchNeuron's layout ----------------------------------------------------------
class MyNet(torch.nn.Module):
    """Its forward is in this file, so the graph's ops carry this file's lines (the ops of a model
    made only of torch.nn modules would point into torch)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.linear(x)) * 2


def small_model_run(monkeypatch, executor=None):
    """MyNet compiled with model_name "MyNet" and compiler_args, run once for inference."""
    torch.manual_seed(0)
    model = MyNet()
    x = torch.randn(2, 4)
    options = {"model_name": "MyNet", "compiler_args": "--opt-level 2"}
    if executor:
        options["executor"] = executor
    with torch.no_grad():
        out = torch.compile(copy.deepcopy(model).to(N), backend="neuron", options=options)(x.to(N))
        # the xla executor is compared with eager (within FLOAT32), the inductor one with Inductor on CPU
        expected = model(x) if executor == "xla" else inductor_on_cpu(model)(x)
    return out, expected


def artifact_files(debug_dir):
    return sorted(os.path.relpath(os.path.join(root, f), debug_dir)
                  for root, _, files in os.walk(debug_dir) for f in files)


@pytest.mark.parametrize("executor", ["xla", "inductor"])
def test_preserved_artifacts_are_written_in_torchneuron_layout(executor, tmp_path, monkeypatch):
    debug_dir = tmp_path / "debug"
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(debug_dir))
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "1")
    out, expected = small_model_run(monkeypatch, executor)
    assert_same(out, expected, **(FLOAT32 if executor == "xla" else {}))
    assert_compiled()

    files = artifact_files(debug_dir)
    patterns = {kind: re.compile(rf"{folder}/proc_0/mynet_({TIMESTAMP})\.{suffix}")
                for kind, folder, suffix in (("fx", "fx_graphs", r"fx\.txt"), ("raw", "raw", r"torch_raw\.mlir"),
                                             ("stablehlo", "stablehlo", r"stablehlo\.mlir"),
                                             ("args", "stablehlo", r"compiler_args\.txt"))}
    found = {kind: [f for f in files if pattern.fullmatch(f)] for kind, pattern in patterns.items()}
    assert all(len(v) == 1 for v in found.values()), files  # one inference graph: one of each
    assert len(files) == 4, files
    stamps = {patterns[kind].fullmatch(v[0]).group(1) for kind, v in found.items()}
    assert len(stamps) == 1, stamps  # one graph, one timestamp

    stablehlo = (debug_dir / found["stablehlo"][0]).read_text()
    assert "func.func @main" in stablehlo and "stablehlo.dot_general" in stablehlo
    forward_line = inspect.getsourcelines(MyNet.forward)[1] + 1
    assert f'loc("{__file__}":{forward_line}:' in stablehlo, stablehlo[-2000:]
    assert "torch.aten" in (debug_dir / found["raw"][0]).read_text()
    assert "torch.ops.aten" in (debug_dir / found["fx"][0]).read_text()
    assert (debug_dir / found["args"][0]).read_text().split() == ["--opt-level", "2"]


def test_no_artifacts_without_the_variable(tmp_path, monkeypatch):
    debug_dir = tmp_path / "debug"
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(debug_dir))
    out, expected = small_model_run(monkeypatch, "xla")
    assert_same(out, expected, **FLOAT32)
    assert artifact_files(debug_dir) == []


# ---- the cache ----------------------------------------------------------------------------------
def test_xla_programs_are_cached_across_dynamo_resets(monkeypatch, xla_compiles):
    model = mlp().to(N)
    x = torch.randn(4, 16, device=N)
    with torch.no_grad():
        first = compile_xla(model, "option", monkeypatch)(x)
        torch._dynamo.reset()
        second = compile_xla(model, "option", monkeypatch)(x)
    assert [m["cache"] for m in backend.get_dynamo_metrics()] == ["miss", "hit"]
    assert len(xla_compiles) == 1
    assert torch.equal(first.cpu(), second.cpu())
    with torch.no_grad():
        assert_same(second, mlp()(x.cpu()), **FLOAT32)



def test_a_cached_program_reports_its_stablehlo_without_lowering_again(monkeypatch, collect):
    """On a cache hit the report gets the StableHLO op counts the entry recorded: nothing is lowered."""
    model = mlp().to(N)
    x = torch.randn(4, 16, device=N)
    with torch.no_grad():
        compile_xla(model, "option", monkeypatch)(x)
        first = dict(collect().compiled_graphs[-1].stablehlo_ops)
        torch._dynamo.reset()
        lowered = []
        monkeypatch.setattr(lowering, "lower", lambda *a, **k: lowered.append(a) or pytest.fail("lowered again"))
        compile_xla(model, "option", monkeypatch)(x)
    assert [m["cache"] for m in backend.get_dynamo_metrics()] == ["miss", "hit"] and not lowered
    graph = collect().compiled_graphs[-1]
    assert graph.lowering == "lowered" and graph.stablehlo_ops == first
    assert first.get("stablehlo.dot_general") == 2


CACHED_PROCESS = """
    import torch
    from torch_neuronx import neuron_dynamo_backend as backend
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    with torch.no_grad():
        out = torch.compile(model.to("neuron"), backend="neuron", options={"executor": "xla"})(x.to("neuron"))
    torch.save(out.cpu(), __import__("sys").argv[1])
    print("CACHE", backend.get_dynamo_metrics()[0]["cache"])
"""


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_xla_programs_are_cached_across_processes(tmp_path):
    cache_dir = str(tmp_path / "shared_cache")
    results = []
    for run_index in range(2):
        path = str(tmp_path / f"out{run_index}.pt")
        proc = isolated.run(CACHED_PROCESS, [path], TORCH_NEURONX_NEFF_CACHE_DIR=cache_dir)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append((proc.stdout.split("CACHE")[-1].strip(), torch.load(path)))
    assert [cache for cache, _ in results] == ["miss", "hit"]
    assert torch.equal(results[0][1], results[1][1])


# ---- TorchNeuron's device rules for compiled graphs ---------------------------------------------
def cpu_model_and_input():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()), torch.randn(2, 4)


def test_cpu_model_returns_neuron_tensors_equal_to_cpu_by_default():
    model, x = cpu_model_and_input()
    with torch.no_grad():
        expected = inductor_on_cpu(copy.deepcopy(model))(x)
        out = torch.compile(model, backend="neuron")(x)
    assert_same(out, expected)


def test_retain_device_mode_returns_cpu_outputs(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_RETAIN_DEVICE_MODE", "1")
    model, x = cpu_model_and_input()
    with torch.no_grad():
        expected = inductor_on_cpu(copy.deepcopy(model))(x)
        out = torch.compile(model, backend="neuron")(x)
    assert out.device.type == "cpu"
    assert torch.equal(out, expected)


def test_disable_cpu_autocopy_refuses_cpu_inputs(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "1")
    model, x = cpu_model_and_input()
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"Input tensor at index \d+ is on cpu device, "
                                                            r"expected neuron"):
        torch.compile(model, backend="neuron")(x)
    torch._dynamo.reset()
    with torch.no_grad():  # neuron inputs are fine
        assert_same(torch.compile(copy.deepcopy(model).to(N), backend="neuron")(x.to(N)), inductor_on_cpu(model)(x))


# ---- lowering as a readiness check --------------------------------------------------------------

def test_readiness_report_lowers_graphs_under_the_default_executor(collect):
    site, spectrum = rfft_site_and_function()
    x = torch.randn(8)
    assert_same(torch.compile(spectrum, backend="neuron")(x.to(N)), inductor_on_cpu(spectrum)(x))
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    with torch.no_grad():
        assert_same(torch.compile(copy.deepcopy(linear).to(N), backend="neuron")(x[:4].to(N)),
                    inductor_on_cpu(linear)(x[:4]))
    assert_compiled()

    report = collect()
    found = [f for f in report.findings if f.kind == "stablehlo-lowering"]
    assert len(found) == 1, found
    assert any("_fft_r2c" in op for op in found[0].ops) and found[0].site.startswith(site), found
    graphs = {g.lowering: g for g in report.compiled_graphs}
    assert set(graphs) == {"failed", "lowered"}, report.compiled_graphs
    assert graphs["lowered"].stablehlo_ops.get("stablehlo.dot_general", 0) >= 1, graphs["lowered"]
    assert "StableHLO lowering" in str(report)


# ---- torch-mlir missing -------------------------------------------------------------------------
MISSING_TORCH_MLIR = """
    import sys
    sys.modules["torch_mlir"] = None  # as if not installed: importing it raises ImportError
    import torch
    from torch_neuronx import diagnostics

    try:
        torch.compile(lambda t: t * 2, backend="neuron", options={"executor": "xla"})(torch.ones(2, device="neuron"))
        print("XLA: no error")
    except Exception as error:
        print("XLA:", str(error).replace("\\n", " "))
    torch._dynamo.reset()
    diagnostics.start()
    try:
        out = torch.compile(lambda t: t * 3, backend="neuron")(torch.ones(2, device="neuron"))
        print("OUT:", out.cpu().tolist())
        earlier = diagnostics.report("Trainium2:2").compiled_graphs
        print("LOWERING:", [g.lowering for g in earlier])
        torch._dynamo.reset()
        diagnostics.start()
        cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                  torch.nn.Linear(4 * 6 * 6, 2)).to("neuron")
        loss = torch.compile(cnn, backend="neuron")(torch.randn(2, 3, 8, 8).to("neuron")).sum()
        loss.backward()
        graphs = [g for g in diagnostics.report("Trainium2:2").compiled_graphs if g not in earlier]
        print("TRAINING:", [(g.name.endswith(".backward"), g.lowering[:12], g.calls) for g in graphs])
    finally:
        diagnostics.stop()
"""


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_without_torch_mlir_xla_says_how_to_install_and_readiness_is_not_checked(tmp_path):
    proc = isolated.run(MISSING_TORCH_MLIR, TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in proc.stdout.splitlines() if ":" in line}
    assert "torch-mlir" in lines["XLA"] and "torch-neuronx-cpu[faithful]" in lines["XLA"], proc.stdout
    assert lines["OUT"] == "[3.0, 3.0]"
    lowering = eval(lines["LOWERING"])  # a list literal printed above
    assert len(lowering) == 1 and lowering[0].startswith("not checked"), lowering
    # a training graph: its forward and its backward are both listed and called, each "not checked"
    assert sorted(eval(lines["TRAINING"])) == [(False, "not checked:", 1), (True, "not checked:", 1)], lines


def test_an_op_left_unlowered_is_named_even_when_mlir_blames_its_constant(monkeypatch):
    """torch-mlir reports a constant an unlowered op leaves behind ('torch.constant.int'); the error
    names the op itself. (aten._fft_r2c, with its int arguments, has no lowering: Trainium has no FFT
    in a compiled graph either.)"""
    def spectrum(x):
        return torch.ops.aten._fft_r2c(x, [1], 0, True).real

    with pytest.raises(Exception) as raised:
        compile_xla(spectrum, "option", monkeypatch)(torch.randn(2, 5).to(N))
    message = str(raised.value)
    assert "aten._fft_r2c at" in message and "constant." not in message.split(" does not lower")[0]


@pytest.mark.parametrize("loss", ["cross_entropy", "mse", "leaky_relu", "attention"])
def test_common_training_graphs_lower_and_match_cpu(loss, monkeypatch):
    """Training graphs TorchNeuron's private lowering handles and stock torch-mlir does not (it crashes
    on cross entropy and computes LeakyReLU's gradient wrongly): the stand-in decompositions make them
    lower and compute CPU's numbers; attention trains through the math decomposition."""
    torch.manual_seed(0)
    weight = torch.randn(5, 8, requires_grad=True)
    x, target = torch.randn(4, 8), torch.tensor([0, 1, 2, 4])

    def step(w, x, target):
        out = x @ w.t()
        if loss == "cross_entropy":
            return torch.nn.functional.cross_entropy(out, target, label_smoothing=0.1)
        if loss == "mse":
            return torch.nn.functional.mse_loss(out, torch.ones_like(out))
        if loss == "leaky_relu":
            return torch.nn.functional.leaky_relu(out, 0.1).square().mean()
        q = out.reshape(1, 1, 4, 5)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).square().sum()

    expected = step(weight, x, target)
    expected.backward()
    w = weight.detach().to(N).requires_grad_()
    got = compile_xla(step, "option", monkeypatch)(w, x.to(N), target.to(N))
    got.backward()
    assert_same(got.detach(), expected.detach(), **FLOAT32)
    assert_same(w.grad, weight.grad, **FLOAT32_GRADS)


# ---- a compiler crash never ends the program ----------------------------------------------------
COMPLEX_CAST = """
    import torch
    t = torch.randn(4, device="neuron")
    out = torch.compile(lambda t: t.cfloat() * 2, backend="neuron")(t)  # torch-mlir aborts on this graph
    print("OUT", out.cpu().tolist())
"""
COMPLEX_CAST_LINE = 4  # the line of the compile, in the program above as run by `python -c`


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_a_compiler_crash_is_a_finding_while_the_report_observes(tmp_path):
    """torch-mlir aborts the process (LLVM ERROR) lowering a cast to complex; readiness lowers every
    graph, in its worker process: the program runs on and the report names the op and the line."""
    proc = isolated.run(COMPLEX_CAST, TORCH_NEURONX_REPORT="1", TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OUT [(" in proc.stdout and "LLVM ERROR" not in proc.stdout
    rows = proc.stderr.split("[stablehlo-lowering]")
    assert len(rows) == 2, proc.stderr[-3000:]
    row = rows[1].split("Fix:")[0]
    assert "aten._to_copy" in row and "stage crash: the compiler crashed (killed by SIGABRT)" in row, row
    assert f"<string>:{COMPLEX_CAST_LINE}" in rows[0].splitlines()[-1], rows[0][-500:]


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it)
@pytest.mark.parametrize("fallback", ["1", "0"])
def test_a_compiler_crash_under_xla_is_a_compilation_error(fallback, tmp_path):
    proc = isolated.run(COMPLEX_CAST, TORCH_NEURONX_COMPILE_EXECUTOR="xla",
                        TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=fallback,
                        TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"))
    if fallback == "0":  # warned, and run eagerly
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "OUT [(" in proc.stdout and "running it eagerly" in proc.stderr
        return
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])  # an exception, not a signal
    message = next(line for line in proc.stderr.splitlines() if line.startswith("NEFFCompilationError"))
    assert "NEFFCompilationError" in message and "aten._to_copy" in message, message
    assert "stage: crash" in message and "the compiler crashed (killed by SIGABRT)" in message, message


def test_lowering_in_the_worker_gives_what_lowering_here_gives():
    """The graph crosses to the worker as a description: the StableHLO that comes back is the one
    this process makes, locations (the user's lines, module paths) included."""
    from torch_neuronx.neuron_dynamo_backend.faithful import lowering_worker

    graph = _aten_graph(MyNet())
    here, there = lowering.lower(graph), lowering_worker.lower(graph)
    assert there.stablehlo == here.stablehlo and there.op_counts == here.op_counts
    assert there.input_dtypes == here.input_dtypes and "stablehlo.dot_general" in there.stablehlo


def test_a_worker_that_cannot_start_is_an_error_not_a_compiler_crash(monkeypatch):
    """A worker that exits on its own (an import failing in it) says so, with what it printed; only a
    worker killed by a signal is "the compiler crashed"."""
    from torch_neuronx.neuron_dynamo_backend.faithful import lowering_worker

    lowering_worker.shutdown()
    monkeypatch.setattr(lowering_worker.sys, "executable", "/bin/false")
    graph = _aten_graph(MyNet())
    with pytest.raises(RuntimeError, match="the lowering worker process exited with status 1") as raised:
        lowering_worker.lower(graph)
    assert not isinstance(raised.value, lowering.LoweringError)
    lowering_worker.shutdown()


def _aten_graph(module):
    from torch._dynamo.backends.common import aot_autograd

    graphs = []
    with torch.no_grad():
        torch.compile(module, backend=aot_autograd(fw_compiler=lambda gm, _: graphs.append(gm) or gm.forward))(
            torch.randn(2, 4))
    return graphs[0]


# ---- readiness follows TorchNeuron's compiled semantics -------------------------------------------

def small_cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(3, 2, 1), torch.nn.Conv2d(8, 8, 3, 1, 1), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))


def _forward_and_backward(report) -> tuple[dict, dict]:
    graphs = {g.name: g for g in report.compiled_graphs}
    [name] = [n for n in graphs if not n.endswith(".backward")]
    assert set(graphs) == {name, f"{name}.backward"}, graphs
    return graphs[name], graphs[f"{name}.backward"]


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_a_compiled_cnn_training_loop_lowers_forward_and_backward_with_no_cpu_fallback_rows(collect):
    """TorchNeuron compiles a graph whole or not at all: max_pool2d_with_indices, which has no eager
    NeuronCore kernel, runs inside the NEFF here. The report lists both graphs AOTAutograd made, each
    with its kind, lowered and costed at each of its calls, and no eager-only finding for their ops."""
    model = small_cnn().to(N)
    step = torch.compile(model, backend="neuron")
    x, y = torch.randn(2, 3, 16, 16).to(N), torch.randint(0, 10, (2,)).to(N)
    for _ in range(2):
        F.cross_entropy(step(x), y).backward()
    report = collect()
    forward, backward = _forward_and_backward(report)
    assert forward.parts == {"forward": "lowered"} and backward.parts == {"backward": "lowered"}
    assert forward.calls == backward.calls == 2
    assert backward.ops > 0 and backward.estimated_ms_per_call > 0 and not backward.error, backward
    assert not {"cpu-fallback", "device-rng", "stablehlo-lowering"} & {f.kind for f in report.findings}
    text = str(report)
    assert f"{forward.name}: forward lowered" in text and f"{backward.name}: backward lowered" in text


class _UserCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.bn(self.conv(x))), 2).flatten(1))


@pytest.mark.parametrize("how", ["module.compile", pytest.param("torch.compile(model)", marks=pytest.mark.long),
                                 pytest.param("compiled loss", marks=pytest.mark.long)])  # make test-long
def test_every_graph_of_a_cnn_trained_with_an_optimizer_is_listed_with_its_kind(collect, how):
    torch.manual_seed(0)
    model = _UserCNN().to(N)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3, 8, 8).to(N), torch.randint(0, 10, (4,)).to(N)
    if how == "module.compile":
        model.compile(backend="neuron")
        loss_of = lambda: F.cross_entropy(model(x), y)  # noqa: E731
    elif how == "torch.compile(model)":
        compiled = torch.compile(model, backend="neuron")
        loss_of = lambda: F.cross_entropy(compiled(x), y)  # noqa: E731
    else:
        loss_of = torch.compile(lambda: F.cross_entropy(model(x), y), backend="neuron")
    for _ in range(3):
        loss = loss_of()
        opt.zero_grad()
        loss.backward()
        opt.step()
    forward, backward = _forward_and_backward(collect())
    assert forward.parts == {"forward": "lowered"} and backward.parts == {"backward": "lowered"}
    assert forward.calls == backward.calls == 3


def test_a_lowering_check_that_stops_after_the_forward_says_so(collect, monkeypatch):
    """An error that is no lowering failure, after the forward lowered: the report says the check
    stopped and that the backward was not lowered, never that the graph lowered."""
    lower = front_end.lower_shaped

    def backward_breaks(shaped, settings, kind):
        if kind == "backward":
            raise RuntimeError("the lowering worker died")
        return lower(shaped, settings, kind)

    monkeypatch.setattr(front_end, "lower_shaped", backward_breaks)
    w = torch.randn(8, 8).to(N).requires_grad_()
    torch.compile(lambda t: (t @ w).sum(), backend="neuron")(torch.randn(2, 8).to(N)).backward()
    report = collect()
    forward, backward = _forward_and_backward(report)
    assert forward.parts == {"forward": "lowered"}
    assert forward.lowering.startswith("not checked: ") and "the lowering worker died" in forward.lowering
    assert backward.lowering == "not lowered" and backward.calls == 1
    text = str(report)
    assert f"{forward.name}: forward lowered; not checked: " in text and f"{backward.name}: not lowered" in text


def test_a_backward_that_does_not_lower_is_a_finding_naming_the_backward_graph(collect):
    """A custom autograd function whose forward lowers and whose backward calls fft, which nothing
    lowers: the forward alone would look ready."""
    class SpectralGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, grad):
            return torch.fft.rfft(grad).real.repeat(2)[:grad.shape[0]]

    w = torch.randn(8).to(N).requires_grad_()
    torch.compile(lambda t: SpectralGrad.apply(t).sum(), backend="neuron")(w).backward()
    report = collect()
    forward, backward = _forward_and_backward(report)
    assert forward.parts == {"forward": "lowered"}
    assert backward.parts == {"backward": "failed: aten._fft_r2c (torch-backend)"}, backward
    [found] = [f for f in report.findings if f.kind == "stablehlo-lowering"]
    assert any("backward graph" in d for d in found.details), found


def test_the_transformer_fast_path_finding_names_its_switch(collect):
    layer = encoder_layer().to(N).eval()
    x = torch.randn(2, 5, 32).to(N)
    with torch.no_grad():
        torch.compile(layer, backend="neuron")(x)
    [found] = [f for f in collect().findings if f.kind == "stablehlo-lowering"]
    assert "torch.backends.mha.set_fastpath_enabled(False)" in found.fix, found


def test_without_the_fast_path_the_transformer_lowers_and_nothing_is_found(collect):
    layer = encoder_layer().to(N).eval()
    x = torch.randn(2, 5, 32).to(N)
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            torch.compile(layer, backend="neuron")(x)
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)
    report = collect()
    assert [g.parts for g in report.compiled_graphs] == [{"inference": "lowered"}]
    assert not report.findings


def test_random_ops_in_a_compiled_graph_compute_differently_but_dropout_and_plain_ones_are_silent(collect):
    """TorchNeuron's random_op_legalization samples a dropout mask before each call with CPU's own
    native_dropout (NativeDropoutOp.sample): the numbers eager draws. Other random ops in a graph
    draw on the device."""
    torch.compile(lambda t: (t * 2).sin(), backend="neuron")(torch.ones(8, device=N))
    assert not collect().findings
    torch._dynamo.reset()
    torch.compile(lambda t: F.dropout(t, 0.5, training=True), backend="neuron")(torch.ones(8, device=N))
    assert not [f for f in collect().findings if f.kind == "compiled-rng"]
    torch._dynamo.reset()
    torch.compile(lambda t: t + torch.rand(8, device=N), backend="neuron")(torch.ones(8, device=N))
    [found] = [f for f in collect().findings if f.kind == "compiled-rng"]
    assert found.severity == "computes-differently"
    assert any("drawn by the compiled program" in d for d in found.details), found


def test_a_custom_op_crosses_to_the_worker_which_imports_its_module():
    """A graph holding a custom op (torch.library.custom_op) is rebuilt in a fresh process, where the
    op exists only once its defining module is imported."""
    import pickle
    import subprocess
    import sys

    from torch.fx.experimental.proxy_tensor import make_fx

    from helpers import custom_ops
    from torch_neuronx.neuron_dynamo_backend.faithful import lowering_worker

    graph = make_fx(lambda x: custom_ops.scaled(x, 2.0) + 1)(torch.randn(3))
    description = lowering_worker.describe(graph)
    rebuild = ("import pickle, sys\nfrom torch_neuronx.neuron_dynamo_backend.faithful import lowering_worker as w\n"
               "g = w.rebuild(pickle.load(sys.stdin.buffer))\nprint([str(n.target) for n in g.graph.nodes])")
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", rebuild], input=pickle.dumps(description), capture_output=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert "neuron_test.scaled.default" in proc.stdout.decode()


# ---- attention dispatches as on a NeuronCore -------------------------------------------------------
def test_sdpa_on_4d_tensors_takes_torchneurons_fused_op_and_3d_the_math_backend():
    """TorchNeuron's backend choice for PrivateUse1 picks the fused overrideable op for 4-D query, key
    and value (its decomposition is what lowers), and math otherwise."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_neuronx.neuron_dynamo_backend.faithful.decompositions import attention_as_math, attention_as_on_neuron

    class Attend(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    for shape, fused in (((1, 2, 6, 4), True), ((2, 6, 4), False)):
        graph = attention_as_on_neuron(torch.fx.symbolic_trace(Attend()))
        with attention_as_math():
            traced = make_fx(graph, tracing_mode="fake")(*[torch.randn(shape, device=N) for _ in range(3)])
        ops = {str(n.target) for n in traced.graph.nodes if n.op == "call_function"}
        assert ("aten._scaled_dot_product_fused_attention_overrideable.default" in ops) == fused, ops


@pytest.mark.parametrize("case", ["causal", "bool-mask", "float-mask", "gqa"])
def test_attention_trains_under_xla_like_cpu(case, monkeypatch):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 6, 8, generator=gen)
    kv_heads = 2 if case == "gqa" else 4
    k, v = (torch.randn(2, kv_heads, 7, 8, generator=gen) for _ in range(2))
    mask = {"bool-mask": torch.rand(6, 7, generator=gen) > 0.3, "float-mask": torch.randn(6, 7, generator=gen)}.get(case)
    mask = mask if mask is None or case != "bool-mask" else mask | torch.eye(6, 7, dtype=torch.bool)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(q.device),
                                              is_causal=case == "causal", enable_gqa=case == "gqa")

    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = attend(*cpu)
    expected.sum().backward()
    neuron = [t.to(N).requires_grad_() for t in (q, k, v)]
    got = compile_xla(attend, "option", monkeypatch)(*neuron)
    got.sum().backward()
    assert_same(got, expected, **FLOAT32)
    for g, e in zip(neuron, cpu):
        assert_same(g.grad, e.grad, **FLOAT32)


def test_a_constant_compared_with_an_integer_lowers_to_the_right_truth_value():
    """torch-mlir folds `full(2.0) < 1` to a truth value that changes from one process to the next;
    the integer goes in as the float it is compared as, which it folds right."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def guarded(q):
        two = torch.full((), 2.0)
        return torch.where(two < 1, float("nan"), q), torch.where(two > 3, float("inf"), q + 1)

    graph = make_fx(guarded)(torch.rand(5))
    lowered = lowering.lower(graph)
    comparisons = [n for n in graph.graph.nodes if n.target in (torch.ops.aten.lt.Scalar, torch.ops.aten.gt.Scalar)]
    assert comparisons and all(type(n.args[1]) is float for n in comparisons)
    assert "0x7FC00000" not in lowered.stablehlo and "0x7F800000" not in lowered.stablehlo, lowered.stablehlo
