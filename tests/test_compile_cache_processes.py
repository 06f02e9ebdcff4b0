"""The compile cache across processes: a second process loads instead of compiling; corrupt
entries, concurrent compilers, an unwritable directory and the disable switch."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from helpers.isolated import run

# Compiles a small model on neuron and reports what the cache and Inductor did.
SCRIPT = """
    import json, torch
    from torch._dynamo.utils import counters
    from torch_neuronx import neuron_dynamo_backend as backend
    from torch_neuronx.neuron_dynamo_backend.caching import neff_cache as cache
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).to("neuron")
    compiled = torch.compile(model, backend="neuron", fullgraph=True, dynamic=False)
    with torch.no_grad():
        out = compiled(torch.linspace(-1, 1, 64).reshape(4, 16).to("neuron"))
    print(json.dumps({"out": out.cpu().tolist(), "metrics": backend.get_dynamo_metrics(),
                      "counters": cache.get_cache().counters,
                      "inductor_misses": counters["inductor"]["fxgraph_cache_miss"]}))
"""


# The same model trained one step: its graph's backward is compiled, and cached, with its forward.
TRAIN_SCRIPT = SCRIPT.replace("with torch.no_grad():\n        out = compiled(", "if True:\n        out = compiled(") \
    .replace('print(json.dumps({"out": out.cpu().tolist(),',
             'out.sum().backward()\n    print(json.dumps({"out": model[0].weight.grad.cpu().tolist(),')


def compile_in_subprocess(neff_dir, script=SCRIPT, **env):
    r = run(script, TORCH_NEURONX_NEFF_CACHE_DIR=str(neff_dir), **env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1]), r.stderr


def entry_files(neff_dir):
    return [os.path.join(d, f) for d, _, files in os.walk(neff_dir) for f in files if f.endswith(".neff")]


def graph_entries(neff_dir):
    """The entries that hold a compiled graph (the others hold the host libraries graphs load)."""
    from torch_neuronx.neuron_dynamo_backend.caching import entries

    def is_graph(path):
        with open(path, "rb") as f:
            return f.read(entries.HEADER_SIZE + 8)[entries.HEADER_SIZE:] == b"NXGRAPH1"

    return [path for path in entry_files(neff_dir) if is_graph(path)]


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it; make test stays under 10 minutes)
def test_cold_then_warm_then_corrupt(tmp_path):
    neff = tmp_path / "neff"
    cold, cold_log = compile_in_subprocess(neff, TORCH_NEURONX_LOG_LEVEL="2")
    assert cold["metrics"][0]["cache"] == "miss" and cold["counters"]["TotalCompilations"] == 1
    assert "[NEFF_CACHE] MISS" in cold_log and "[NEFF_CACHE] Storing" in cold_log
    [entry] = graph_entries(neff)
    assert (neff / "inductor").is_dir()  # Inductor's working cache lives beside the entries

    warm, warm_log = compile_in_subprocess(neff, TORCH_NEURONX_LOG_LEVEL="2")
    assert warm["metrics"][0]["cache"] == "hit" and "[NEFF_CACHE] HIT" in warm_log
    assert warm["counters"]["TotalCompilations"] == 0 and warm["counters"]["PersistentHits"] == 1
    assert warm["inductor_misses"] == 0  # the compiler was not invoked
    assert warm["out"] == cold["out"]

    with open(entry, "r+b") as f:  # flip a payload byte: the checksum must catch it
        f.seek(-10, os.SEEK_END)
        byte = f.read(1)
        f.seek(-10, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    again, again_log = compile_in_subprocess(neff)
    assert again_log.count("corrupt compile cache entry") == 1
    assert again["counters"]["CorruptEntries"] == 1 and again["counters"]["TotalCompilations"] == 1
    assert again["out"] == cold["out"]
    healed, _ = compile_in_subprocess(neff)
    assert healed["metrics"][0]["cache"] == "hit"


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it)
def test_concurrent_compilers_share_one_entry(tmp_path):
    neff = tmp_path / "neff"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NEURON_", "TORCH_NEURONX_", "TORCHINDUCTOR_CACHE_DIR"))}
    env["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(neff)
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(SCRIPT)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.splitlines()[-1]))
    assert all(r["out"] == results[0]["out"] for r in results)
    assert sum(r["counters"]["TotalCompilations"] for r in results) == 1  # one compiled, the rest loaded
    assert len(graph_entries(neff)) == 1 and sum(r["counters"]["CorruptEntries"] for r in results) == 0


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it; make test stays under 10 minutes)
def test_unwritable_directory_warns_once_and_compiles(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    result, log = compile_in_subprocess(blocker)
    assert result["metrics"][0]["cache"] == "miss" and result["counters"]["WriteFailures"] >= 1
    assert log.count("RuntimeWarning") == 1 and str(blocker) in log


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it)
def test_disabled_cache_compiles_and_stores_nothing(tmp_path):
    # The variable's spellings are checked in test_compile_cache.py; this is the end-to-end effect.
    neff = tmp_path / "neff"
    for _ in range(2):
        result, _ = compile_in_subprocess(neff, TORCH_NEURONX_NEFF_DISABLE_CACHE="true")
        assert result["metrics"][0]["cache"] == "miss" and result["metrics"][0]["compile_us"] > 0
        assert result["counters"]["PersistentHits"] == result["counters"]["InMemoryHits"] == 0
    assert not neff.exists() or entry_files(neff) == []


# Dynamo's caching precompile: the whole compiled function (guards, generated bytecode, graphs) in
# the NEFF cache. Run from a file: Dynamo checks the traced source is unchanged before reusing it.
PRECOMPILE_SCRIPT = """
import functools, json, sys, torch
from torch._dynamo.package import CompilePackage
from torch._dynamo.utils import counters
from torch_neuronx import neuron_dynamo_backend as backend
from torch_neuronx.neuron_dynamo_backend.caching import precompile

class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.scale = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8), 0.5

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))) * self.scale

def wrapped_in_closure(forward_fn):  # as diffusers' apply_lora_scale wraps a forward
    @functools.wraps(forward_fn)
    def wrapper(self, *args, **kwargs):
        return forward_fn(self, *args, **kwargs)
    return wrapper

class Decorated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    @wrapped_in_closure
    def forward(self, x, scale=2.0, shift=None):
        return self.fc(x) * scale

def traced():
    return counters["stats"]["unique_graphs"]

torch.manual_seed(0)
cpu_model = Scaled()
model = Scaled().to("neuron")
model.load_state_dict(cpu_model.state_dict())
x = torch.linspace(-1, 1, 64).reshape(4, 16)
compiled = torch.compile(model, backend="neuron", fullgraph=True, dynamic=False)
report = {"key": precompile._entry_key(CompilePackage.source_id_from_fn(Scaled.forward))}
with torch.no_grad():
    out = compiled(x.to("neuron")).cpu()
    report.update(out=out.tolist(), traced=traced(), cache=dict(counters["dynamo_cache"]),
                  graphs=[m["cache"] for m in backend.get_dynamo_metrics()],
                  diff_vs_cpu=(out - cpu_model(x)).abs().max().item())
    if "guards" in sys.argv:  # a new shape, then a changed attribute: each must trace and compile again
        x3 = x[:3] + 1
        report["diff_new_shape"] = (compiled(x3.to("neuron")).cpu() - cpu_model(x3)).abs().max().item()
        report["traced_after_shape"] = traced()
        model.scale = cpu_model.scale = 0.25
        report["diff_new_scale"] = (compiled(x.to("neuron")).cpu() - cpu_model(x)).abs().max().item()
        report["traced_after_scale"] = traced()
    if "decorated" in sys.argv:  # a guard on the closure's variable cannot be built in a new process
        decorated = torch.compile(Decorated().to("neuron"), backend="neuron", fullgraph=True, dynamic=False)
        report["decorated_out"] = decorated(x.to("neuron")).cpu().tolist()
print(json.dumps(report))
"""


def precompile_in_subprocess(script, neff_dir, *argv):
    r = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
                       | {"TORCH_NEURONX_NEFF_CACHE_DIR": str(neff_dir), "TORCH_CACHING_PRECOMPILE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1]), r.stderr


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_precompiled_function_is_not_traced_again_but_its_guards_hold(tmp_path):
    script, neff = tmp_path / "precompiled.py", tmp_path / "neff"
    script.write_text(textwrap.dedent(PRECOMPILE_SCRIPT))
    cold, _ = precompile_in_subprocess(script, neff, "decorated")
    assert cold["traced"] == 1 and cold["graphs"] == ["miss"] and cold["diff_vs_cpu"] < 1e-5
    package = os.path.join(neff, cold["key"][:2], cold["key"][2:4], cold["key"] + ".neff")
    assert os.path.isfile(package)  # the whole function, beside its graph's entry

    warm, warm_log = precompile_in_subprocess(script, neff, "guards", "decorated")
    assert warm["traced"] == 0 and warm["cache"] == {"dynamo_cache_hit": 1}  # Dynamo did not trace
    assert warm["graphs"] == ["precompiled"] and warm["out"] == cold["out"]
    assert warm["traced_after_shape"] == 1 and warm["diff_new_shape"] < 1e-5  # the guards still hold
    assert warm["traced_after_scale"] == 2 and warm["diff_new_scale"] < 1e-5
    # its package is refused with a warning naming it, and the function is traced: same result
    assert "could not use compiled function Decorated.forward" in warm_log
    assert warm["decorated_out"] == cold["decorated_out"]

    with open(package, "r+b") as f:  # flip a byte of the package: the checksum catches it
        f.seek(-10, os.SEEK_END)
        byte = f.read(1)
        f.seek(-10, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    again, log = precompile_in_subprocess(script, neff)
    assert log.count("corrupt compile cache entry") == 1 and cold["key"] in log
    assert again["traced"] == 1 and again["out"] == cold["out"] and again["graphs"] == ["hit"]


# The same file imported by name, then run as a script: two modules, one function source.
TWO_NAMES_SCRIPT = """
import json, sys, torch
from torch._dynamo.utils import counters
from torch_neuronx import neuron_dynamo_backend as backend
print("top level of", __name__, file=sys.stderr)

class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x)) * 0.5

def main():
    torch.manual_seed(0)
    model = Scaled()
    x = torch.linspace(-1, 1, 64).reshape(4, 16)
    expected = model(x)
    compiled = torch.compile(model.to("neuron"), backend="neuron", fullgraph=True, dynamic=False)
    with torch.no_grad():
        out = compiled(x.to("neuron")).cpu()
    print(json.dumps({"diff_vs_cpu": (out - expected).abs().max().item(), "traced": counters["stats"]["unique_graphs"],
                      "graphs": [m["cache"] for m in backend.get_dynamo_metrics()]}))

if __name__ == "__main__":
    main()
"""


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it)
def test_package_of_a_module_is_refused_when_the_file_runs_as_a_script(tmp_path):
    # Installed into __main__, the package's code lacked the globals it names (NameError on the next
    # run), and checking its sources imported the script a second time.
    (tmp_path / "scaledmod.py").write_text(textwrap.dedent(TWO_NAMES_SCRIPT))
    importer, neff = tmp_path / "importer.py", tmp_path / "neff"
    importer.write_text("import scaledmod\nscaledmod.main()\n")
    imported, _ = precompile_in_subprocess(importer, neff)
    assert imported["traced"] == 1 and imported["diff_vs_cpu"] < 1e-6
    as_script, log = precompile_in_subprocess(tmp_path / "scaledmod.py", neff)
    assert "it was compiled in module 'scaledmod', and the function is now in '__main__'" in log
    assert "top level of scaledmod" not in log  # the script was not imported by name
    assert as_script["traced"] == 1 and as_script["diff_vs_cpu"] < 1e-6
    again, _ = precompile_in_subprocess(tmp_path / "scaledmod.py", neff)  # its own package now
    assert again["traced"] == 0 and again["graphs"] == ["precompiled"] and again["diff_vs_cpu"] < 1e-6


# Compiles the small model on neuron, counting Inductor's ISA dlopen probes (each a `python -c` subprocess).
ISA_SCRIPT = """
    import json, subprocess, torch
    from torch._dynamo.utils import counters
    from torch._inductor import cpu_vec_isa
    from torch_neuronx.neuron_dynamo_backend.caching import isa_probe
    probes, real_run = [], subprocess.run
    def counting_run(cmd, *args, **kwargs):
        if isinstance(cmd, list) and "-c" in cmd and "LoadLibrary" in cmd[-1]:
            probes.append(cmd[-1])
        return real_run(cmd, *args, **kwargs)
    subprocess.run = counting_run
    users_config = torch._inductor.config.get_config_copy()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    x = torch.linspace(-1, 1, 64).reshape(4, 16)
    expected = model(x)
    compiled = torch.compile(model.to("neuron"), backend="neuron", fullgraph=True, dynamic=False)
    with torch.no_grad():
        out = compiled(x.to("neuron")).cpu()
    print(json.dumps({"out": out.tolist(), "max_error": (out - expected).abs().max().item(),
                      "probes": len(probes), "remembered": isa_probe.counters["remembered"],
                      "isas": [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()],
                      "fx": {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph")},
                      "config_unchanged": torch._inductor.config.get_config_copy() == users_config}))
"""


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_warm_process_runs_no_isa_probe_and_hits_inductors_cache(tmp_path):
    neff = tmp_path / "neff"
    records = neff / "inductor" / "vec_isa_probes"

    def compile_once():
        r = run(ISA_SCRIPT, TORCH_NEURONX_NEFF_CACHE_DIR=str(neff))
        assert r.returncode == 0, r.stderr[-3000:]
        result = json.loads(r.stdout.splitlines()[-1])
        assert result["max_error"] < 1e-5 and result["config_unchanged"]
        return result, r.stderr

    cold, _ = compile_once()
    assert cold["probes"] > 0 and cold["remembered"] == 0 and cold["fx"].get("fxgraph_cache_miss", 0) >= 1
    written = {p.name: p.read_bytes() for p in records.iterdir()}
    assert len(written) == cold["probes"]  # every probe loaded, so every probe was recorded

    warm, _ = compile_once()
    assert warm["probes"] == 0 and warm["remembered"] == cold["probes"]
    assert warm["fx"].get("fxgraph_cache_hit", 0) >= 1 and warm["fx"].get("fxgraph_cache_miss", 0) == 0
    assert warm["isas"] == cold["isas"] and warm["out"] == cold["out"]

    damaged = sorted(written)[0]
    (records / damaged).write_bytes(b"not a record")
    healed, log = compile_once()
    assert healed["probes"] == 1 and healed["remembered"] == cold["probes"] - 1 and "probe" not in log
    assert {p.name: p.read_bytes() for p in records.iterdir()} == written  # rewritten as it was
    assert healed["isas"] == cold["isas"] and healed["out"] == cold["out"]


@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it)
def test_forced_capability_never_reuses_code_built_for_the_cpus_own_isa(tmp_path):
    """Inductor's FX graph cache keys leave out ATEN_CPU_CAPABILITY: in a directory it shares with
    native runs (the user's TORCHINDUCTOR_CACHE_DIR, or Inductor's default when the NEFF cache
    directory is unusable), a run under `default` was handed AVX code that failed to build."""
    shared = tmp_path / "inductor"
    native_env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    native_env.update(TORCHINDUCTOR_CACHE_DIR=str(shared), TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "a"))
    native = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], env=native_env,
                            capture_output=True, text=True, timeout=300)
    assert native.returncode == 0, native.stderr[-3000:]
    forced, _ = compile_in_subprocess(tmp_path / "b", TORCHINDUCTOR_CACHE_DIR=str(shared),
                                      ATEN_CPU_CAPABILITY="default")
    expected = json.loads(native.stdout.splitlines()[-1])["out"]
    assert all(abs(a - b) <= 1e-5 for row, ref in zip(forced["out"], expected) for a, b in zip(row, ref))


# A machine with other users. The attack reported: append a line to Inductor's generated module in
# the cache, and it ran in the next process that compiled. Now the cache loads code only from a
# directory yours alone, or verified with a key.
@pytest.mark.long  # subprocesses for seconds each: make test-long (CI runs it; make test stays under 10 minutes)
def test_code_planted_in_a_cache_others_can_write_never_runs(tmp_path):
    neff, marker = tmp_path / "neff", tmp_path / "planted-code-ran"
    isolated = {"TMPDIR": str(tmp_path)}  # where the per-user fallback goes
    cold, _ = compile_in_subprocess(neff, **isolated)
    modules = list((neff / "inductor").rglob("*.py"))
    assert modules
    for module in modules:
        with open(module, "a") as f:
            f.write(f"\nopen({str(marker)!r}, 'w').close()\n")
    yours_alone, _ = compile_in_subprocess(neff, **isolated)
    assert marker.exists()  # the control: in your own directory your own edit runs, as in Inductor's cache
    marker.unlink()
    os.chmod(neff, 0o777)  # now anyone could have made that edit
    refused, log = compile_in_subprocess(neff, **isolated)
    assert not marker.exists() and refused["out"] == yours_alone["out"] == cold["out"]
    assert f"not using {neff} as the compile cache" in log and "mode 0777" in log
    assert refused["counters"]["TotalCompilations"] == 1  # compiled again, in tmp/neff_cache-<uid>
    assert (tmp_path / f"neff_cache-{os.geteuid()}").is_dir()


def _logging_compiler(tmp_path):
    """A compiler that writes each command line to a log, then runs the real one."""
    log, wrapper = tmp_path / "compiler.log", tmp_path / "g++"
    real = os.environ.get("CXX") or "g++"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), log


@pytest.mark.long  # minutes of subprocesses: make test-long (CI runs it; make test stays under 10 minutes)
@pytest.mark.parametrize("script", [SCRIPT, TRAIN_SCRIPT], ids=["inference", "training"])
def test_a_shared_cache_copied_to_a_second_machine_compiles_nothing_and_refuses_tampering(tmp_path, script):
    from torch_neuronx.neuron_dynamo_backend.caching import entries

    compiler, log = _logging_compiler(tmp_path)
    env = {"CXX": compiler, "TORCH_NEURONX_NEFF_CACHE_KEY": "the-team-key-0123456789", "TMPDIR": str(tmp_path),
           "script": script}
    first, _ = compile_in_subprocess(tmp_path / "a", TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR=str(tmp_path / "local-a"),
                                     **env)
    assert first["counters"]["TotalCompilations"] == 1 and ".cpp" in log.read_text()
    assert not (tmp_path / "a" / "inductor").exists()  # a keyed cache holds entries only
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # as CI restores a cache on another runner
    log.unlink()
    second, _ = compile_in_subprocess(tmp_path / "b", TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR=str(tmp_path / "local-b"),
                                      **env)
    assert second["metrics"][0]["cache"] == "hit" and second["counters"]["TotalCompilations"] == 0
    assert second["inductor_misses"] == 0 and second["out"] == first["out"]
    assert ".cpp" not in (log.read_text() if log.exists() else "")  # not a kernel, not an ISA probe built

    [entry] = graph_entries(tmp_path / "b")
    data = open(entry, "rb").read()
    payload = bytearray(data[entries.HEADER_SIZE:])
    payload[-20] ^= 1
    mac = data[entries.HEADER_SIZE - 32:entries.HEADER_SIZE]
    with open(entry, "wb") as f:  # anyone can recompute the checksum; only the key's holders the MAC
        f.write(entries.pack("x" * 32, bytes(payload), None)[:entries.HEADER_SIZE - 32] + mac + payload)
    third, log_text = compile_in_subprocess(tmp_path / "b", TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR=str(tmp_path / "c"),
                                            **env)
    assert "MAC does not verify" in log_text and third["counters"]["RejectedEntries"] == 1
    assert third["counters"]["TotalCompilations"] == 1 and third["out"] == first["out"]
