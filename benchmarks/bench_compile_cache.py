"""The compile cache's warm start, yours alone and shared with a key, and on a second machine.

Each start is a fresh process compiling bench_compile's small transformer with
``backend="neuron"`` and making its first call (bench_compile's own child). Per round, each in new
directories: a cold and then a warm start in a cache yours alone; a cold and then a warm start in a
cache shared with a key (its entries signed, checked by their MAC before they load; Inductor's
working cache in the local directory); and a "second machine": that shared cache copied whole into a
new directory, with an empty local directory, as a CI runner restores a cache. The two warm starts
run in alternating order. Reported: the per-round ratios of the signed warm start to the private
one (target <= 1.05: verifying must not slow a warm start), of the second machine to the private
warm start (reported: it writes the libraries and runs the ISA probes' loads a new working cache
lacks), and of the cold start to the second machine; the second machine must compile nothing.

    python benchmarks/bench_compile_cache.py [--json PATH] [--rounds N] [--threads N]
"""
import os
import shutil
import statistics
import sys
import tempfile
import time

import common  # beside this script (sys.path[0])
from targets import target as target_entry

SIGNED_TARGET = 1.05
KEY = "bench-compile-cache-key-0123456789"
CHILD_MARK, CHILD_TIMEOUT_S = "BENCH_COMPILE_RESULT ", 600  # bench_compile's child


def start(threads, cache_dir, local_dir, key=None):
    """One start (compile + first call) in a fresh process: bench_compile's transformer child."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NEURONX_NEFF_")
           and k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(TORCH_NEURONX_NEFF_CACHE_DIR=cache_dir, TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR=local_dir,
               TORCH_CACHING_PRECOMPILE="0")
    if key:
        env["TORCH_NEURONX_NEFF_CACHE_KEY"] = key
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_compile.py")
    result = common.run_child_process([sys.executable, script, "--threads", str(threads), "--_child", "transformer"],
                                      env, CHILD_MARK, CHILD_TIMEOUT_S)
    if "error" in result:
        raise SystemExit(f"a start failed ({result['error']}):\n{result['stderr']}")
    return result


def one_round(threads, index, root):
    """The five starts of one round, in directories of their own under ``root``."""
    d = {name: os.path.join(root, name) for name in ("private", "local", "shared", "shared-local", "copy",
                                                     "copy-local")}
    runs = {"cold_private": start(threads, d["private"], d["local"]),
            "cold_shared": start(threads, d["shared"], d["shared-local"], KEY)}
    warm = {"warm_private": lambda: start(threads, d["private"], d["local"]),
            "warm_shared": lambda: start(threads, d["shared"], d["shared-local"], KEY)}
    for name in common.round_order(list(warm), index):
        runs[name] = warm[name]()
    shutil.copytree(d["shared"], d["copy"])  # a keyed cache holds entries only: what CI would restore
    runs["second_machine"] = start(threads, d["copy"], d["copy-local"], KEY)
    return runs


def main():
    parser = common.arguments(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    load, t0 = common.load_average(), time.perf_counter()
    rounds = []
    for index in range(options.rounds):
        with tempfile.TemporaryDirectory(prefix="bench_compile_cache_") as root:
            rounds.append(one_round(options.threads, index, root))
        print(f"  round {index + 1}: " + ", ".join(f"{k} {v['wall_s']:.2f} s" for k, v in rounds[-1].items()),
              file=sys.stderr, flush=True)
    ratios = {
        "signed / private warm start": [r["warm_shared"]["wall_s"] / r["warm_private"]["wall_s"] for r in rounds],
        "second machine / private warm start": [r["second_machine"]["wall_s"] / r["warm_private"]["wall_s"]
                                                for r in rounds],
        "cold / second machine": [r["cold_shared"]["wall_s"] / r["second_machine"]["wall_s"] for r in rounds],
    }
    compiled_nothing = all(c == "hit" for r in rounds for c in r["second_machine"]["caches"])
    same = all(r[k]["output_sha256"] == r["cold_private"]["output_sha256"] for r in rounds for k in r)
    print(f"compile cache warm starts: {options.rounds} rounds, {options.threads} threads; "
          f"{common.conditions(load, common.load_average(), time.perf_counter() - t0)}\n")
    rows = [(name, f"{statistics.median(r[name]['wall_s'] for r in rounds):.2f} s") for name in rounds[0]]
    print(common.markdown_table(["start (compile + first call)", "median wall"], rows, "lr"))
    for name, values in ratios.items():
        print(f"{name}: {statistics.median(values):.3f}x [{min(values):.3f}, {max(values):.3f}]")
    met = statistics.median(ratios["signed / private warm start"]) <= SIGNED_TARGET and compiled_nothing and same
    print(f"second machine compiled nothing: {compiled_nothing}; every start's output equal: {same}; "
          f"{common.verdict(met)}")
    if options.json:
        common.write_json(options.json, {"rounds": rounds, "ratios": ratios, "compiled_nothing": compiled_nothing,
                                         "targets": [target_entry("compile cache: signed warm start over private",
                                                                  ratios["signed / private warm start"],
                                                                  SIGNED_TARGET)]})
    common.report_outcome([] if met else ["signed warm start, or the second machine compiled"])


if __name__ == "__main__":
    main()
