"""The compile cache across processes: a second process loads instead of compiling; corrupt
entries, concurrent compilers, an unwritable directory and the disable switch."""
import json
import os
import subprocess
import sys
import textwrap


from helpers.isolated import run

# Compiles a small model on neuron and reports what the cache and Inductor did.
SCRIPT = """
    import json, torch
    from torch._dynamo.utils import counters
    from torch_neuronx import neuron_dynamo_backend as backend
    from torch_neuronx.neuron_dynamo_backend import cache
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).to("neuron")
    compiled = torch.compile(model, backend="neuron", fullgraph=True, dynamic=False)
    with torch.no_grad():
        out = compiled(torch.linspace(-1, 1, 64).reshape(4, 16).to("neuron"))
    print(json.dumps({"out": out.cpu().tolist(), "metrics": backend.get_dynamo_metrics(),
                      "counters": cache.get_cache().counters,
                      "inductor_misses": counters["inductor"]["fxgraph_cache_miss"]}))
"""


def compile_in_subprocess(neff_dir, **env):
    r = run(SCRIPT, TORCH_NEURONX_NEFF_CACHE_DIR=str(neff_dir), **env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1]), r.stderr


def entry_files(neff_dir):
    return [os.path.join(d, f) for d, _, files in os.walk(neff_dir) for f in files if f.endswith(".neff")]


def test_cold_then_warm_then_corrupt(tmp_path):
    neff = tmp_path / "neff"
    cold, cold_log = compile_in_subprocess(neff, TORCH_NEURONX_LOG_LEVEL="2")
    assert cold["metrics"][0]["cache"] == "miss" and cold["counters"]["TotalCompilations"] == 1
    assert "[NEFF_CACHE] MISS" in cold_log and "[NEFF_CACHE] Storing" in cold_log
    [entry] = entry_files(neff)
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
    assert len(entry_files(neff)) == 1 and sum(r["counters"]["CorruptEntries"] for r in results) == 0


def test_unwritable_directory_warns_once_and_compiles(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    result, log = compile_in_subprocess(blocker)
    assert result["metrics"][0]["cache"] == "miss" and result["counters"]["WriteFailures"] >= 1
    assert log.count("RuntimeWarning") == 1 and str(blocker) in log


def test_disabled_cache_compiles_and_stores_nothing(tmp_path):
    # The variable's spellings are checked in test_compile_cache.py; this is the end-to-end effect.
    neff = tmp_path / "neff"
    for _ in range(2):
        result, _ = compile_in_subprocess(neff, TORCH_NEURONX_NEFF_DISABLE_CACHE="true")
        assert result["metrics"][0]["cache"] == "miss" and result["metrics"][0]["compile_us"] > 0
        assert result["counters"]["PersistentHits"] == result["counters"]["InMemoryHits"] == 0
    assert not neff.exists() or entry_files(neff) == []
