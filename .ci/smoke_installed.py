"""Smoke test of an installed (non-editable) torch-neuronx-cpu, run from outside the checkout.

Usage: python smoke_installed.py CHECKOUT_DIR   (with the venv's python, cwd a scratch folder)
Each check is what a new user does first; any failure exits non-zero with its output.
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap

CHECKOUT = os.path.realpath(sys.argv[1])
PYTHON = sys.executable
BIN = os.path.dirname(PYTHON)
CHECKS = []


def check(name):
    def record(fn):
        CHECKS.append((name, fn))
        return fn
    return record


def run(args, env=None, code=None, status=0, cwd=None):
    env = {**os.environ, **(env or {})}
    if code is not None:
        args = [PYTHON, "-c", textwrap.dedent(code)] + list(args)
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900, cwd=cwd)
    if r.returncode != status:
        raise AssertionError(f"{args[:3]} exited {r.returncode}, not {status}\nstdout: {r.stdout[-2000:]}\n"
                             f"stderr: {r.stderr[-3000:]}")
    return r


@check("the package comes from the venv, not the checkout, and its core is this Python's")
def _installed():
    out = run([], code="""
        import torch, torch_neuronx, torch_neuronx.runtime.core as core
        print(torch_neuronx.__file__); print(core.core_path())
    """).stdout.split()
    for path in out:
        assert not os.path.realpath(path).startswith(CHECKOUT), f"{path} is inside the checkout"
        assert "site-packages" in path, path


@check("every module of the checkout is installed")
def _modules():
    # Compared as files, not imported: the demo needs its extra, which this venv leaves out on purpose.
    def modules(top):
        return sorted(os.path.relpath(os.path.join(root, name), top)
                      for root, _, files in os.walk(top) for name in files if name.endswith(".py"))
    installed = run([], code="""
        import importlib.util
        print(importlib.util.find_spec("torch_neuronx").submodule_search_locations[0])
    """).stdout.strip()
    expected = modules(os.path.join(CHECKOUT, "torch_neuronx"))
    missing = sorted(set(expected) - set(modules(installed)))
    assert not missing, f"not installed: {missing}"
    plugin = run([], code="import torch_neuronx_pytest; print(torch_neuronx_pytest.__file__)").stdout.strip()
    assert "site-packages" in plugin, plugin


@check("the demo without its extra names what to install")
def _demo_extra():
    r = subprocess.run([os.path.join(BIN, "neuronx-demo")], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "torch-neuronx-cpu[demo]" in r.stderr, r.stderr[-2000:]


@check("a neuron tensor, after import torch alone")
def _tensor():
    out = run([], code="""
        import torch
        x = torch.arange(6.0, device="neuron").reshape(2, 3)
        y = (x @ x.T).relu().sum()
        print(y.device, float(y))
    """).stdout.split()
    assert out == ["neuron:0", "83.0"], out  # [[5, 14], [14, 50]]


@check("torch.compile(backend='neuron'), forward and backward")
def _compile():
    out = run([], code="""
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).to("neuron")
        x = torch.randn(4, 8, device="neuron")
        compiled = torch.compile(m, backend="neuron", fullgraph=True)
        y = compiled(x)
        torch.testing.assert_close(y.cpu(), m.cpu()(x.cpu()))
        m.to("neuron")
        compiled(x).sum().backward()
        from torch_neuronx.neuron_dynamo_backend import get_dynamo_metrics
        print(y.device, len(get_dynamo_metrics()) >= 1)
    """).stdout.split()
    assert out == ["neuron:0", "True"], out


@check("torch_neuronx.report() and op tracking")
def _report():
    out = run([], code="""
        import torch, torch_neuronx
        torch_neuronx.diagnostics.start()
        x = torch.randn(4, 4, device="neuron", dtype=torch.float64)
        (x * 2).sum().item()
        report = torch_neuronx.report()
        print("aten::mul.Tensor" in torch_neuronx.get_executed_ops())
        print(sorted({f.kind for f in report.findings}))
    """).stdout.splitlines()
    assert out[0] == "True" and "float64" in out[1], out


@check("python -m torch_neuronx.run script.py")
def _run_wrapper():
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "train.py")
        with open(script, "w") as f:
            f.write("import torch\nx = torch.ones(3, device='neuron', dtype=torch.float64)\nprint(float(x.sum()))\n")
        r = run([PYTHON, "-m", "torch_neuronx.run", "--output-dir", os.path.join(folder, "out"), script])
        assert "3.0" in r.stdout, r.stdout
        with open(os.path.join(folder, "out", "report.json")) as f:
            report = json.load(f)
        assert any(f["kind"] == "float64" for f in report["findings"]), report["findings"]


@check("the readiness gate exits 3 on a channels_last copy, and pytest --neuron-readiness fails that test")
def _gate_and_plugin():
    copy = "import torch\n\ndef test_copy():\n    torch.ones(1, 2, 3, 3, device='neuron').to(memory_format=torch.channels_last)\n"
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "test_copy.py"), "w") as f:
            f.write(copy + "\n\ndef test_plain():\n    torch.ones(2, device='neuron')\n\ntest_copy()\n")
        r = run([PYTHON, "-m", "torch_neuronx.run", "--fail-on", "would-fail", "--format", "sarif", "test_copy.py"],
                status=3, cwd=folder)
        assert "FAILED, exit status 3" in r.stderr and "test_copy.py:4" in r.stderr, r.stderr
        with open(os.path.join(folder, "neuron_report", "report.sarif")) as f:
            assert json.load(f)["runs"][0]["results"][0]["ruleId"] == "layout-change"
        r = run([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--neuron-readiness", "test_copy.py"],
                status=1, cwd=folder)
        assert "1 failed, 1 passed" in r.stdout and "FAILED test_copy.py::test_copy" in r.stdout, r.stdout


@check("python -m torch_neuronx.simulate times marked steps, and --recost re-costs the plan")
def _simulate():
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "tp.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent("""
                import torch, torch.distributed as dist
                from torch_neuronx.simulate import step
                dist.init_process_group("neuron")
                w = torch.ones(256, 256, device="neuron")
                for _ in range(2):
                    with step("decode", tokens=1):
                        y = torch.ones(1, 256, device="neuron") @ w
                        dist.all_reduce(y)
            """))
        out = os.path.join(folder, "plan")
        run([PYTHON, "-m", "torch_neuronx.simulate", "--quiet", "--nproc-per-node", "2", "--instance",
             "trn2.3xlarge", "--out", out, script])
        with open(os.path.join(out, "plan.json")) as f:
            plan = json.load(f)
        decode = plan["time"]["steps"]["decode"]
        assert decode["count"] == 2 and decode["per_token_seconds"] > 0, decode  # one estimate (schema 3)
        again = os.path.join(folder, "again")
        run([PYTHON, "-m", "torch_neuronx.simulate", "--quiet", "--recost", os.path.join(out, "plan.json"),
             "--instance", "trn3-gen1", "--out", again])
        with open(os.path.join(again, "plan.json")) as f:
            assert json.load(f)["instance"] == "trn3-gen1"


@check("TORCH_NEURONX_REPORT=1 prints the report at exit")
def _report_env():
    r = run([], env={"TORCH_NEURONX_REPORT": "1"}, code="""
        import torch
        print(float(torch.ones(2, device="neuron").sum()))
    """)
    assert "2.0" in r.stdout and "neuron" in r.stderr.lower() and "Trainium" in r.stderr, r.stderr


@check("neuron-ls and neuron-cache")
def _scripts():
    r = run([os.path.join(BIN, "neuron-ls")])
    assert "NEURON" in r.stdout.upper(), r.stdout
    r = run([os.path.join(BIN, "neuron-ls"), "--json-output"])
    json.loads(r.stdout)
    with tempfile.TemporaryDirectory() as folder:
        r = run([os.path.join(BIN, "neuron-cache"), "--dir", folder, "size"])
        assert r.stdout.strip(), r.stdout


@check("a compile cache shared with a key: a copy compiles nothing, another key is refused")
def _shared_cache():
    code = """
        import torch
        from torch_neuronx.neuron_dynamo_backend import get_dynamo_metrics
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).to("neuron")
        y = torch.compile(m, backend="neuron", fullgraph=True)(torch.ones(4, 8, device="neuron"))
        print(get_dynamo_metrics()[0]["cache"], y.sum().item())
    """
    with tempfile.TemporaryDirectory() as folder:
        key = {"TORCH_NEURONX_NEFF_CACHE_KEY": "smoke-test-key-0123456789"}

        def compile_in(name, local, **env):
            return run([], code=code, env={"TORCH_NEURONX_NEFF_CACHE_DIR": os.path.join(folder, name),
                                           "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR": os.path.join(folder, local),
                                           "TMPDIR": folder, **key, **env}).stdout.split()

        first = compile_in("a", "local-a")
        subprocess.run(["cp", "-r", os.path.join(folder, "a"), os.path.join(folder, "b")], check=True)
        second = compile_in("b", "local-b")
        assert first[0] == "miss" and second == ["hit", first[1]], (first, second)
        verify = [os.path.join(BIN, "neuron-cache"), "--dir", os.path.join(folder, "b"), "verify"]
        assert "would load" in run(verify, env=key).stdout
        run(verify, env={"TORCH_NEURONX_NEFF_CACHE_KEY": "another-key-0123456789"}, status=1)


@check("a backward exits 0, twenty times")
def _exits():
    for _ in range(20):
        run([], code="""
            import torch
            m = torch.nn.Linear(8, 8).to("neuron")
            m(torch.randn(4, 8, device="neuron")).sum().backward()
        """)


failed = 0
for name, fn in CHECKS:
    try:
        fn()
        print(f"ok    {name}", flush=True)
    except Exception as error:  # noqa: BLE001 - report every check
        failed += 1
        print(f"FAIL  {name}\n{error}", flush=True)
print(f"wheel smoke test: {failed} of {len(CHECKS)} checks failed" if failed else
      f"wheel smoke test: all {len(CHECKS)} checks succeeded")
sys.exit(1 if failed else 0)
