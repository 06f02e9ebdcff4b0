"""What the pytest plugin costs a test run: installed but not asked for, and observing each test.

A generated file of small neuron tests runs in a fresh pytest three ways, interleaved round by
round (the order rotating and reversing): without the plugin (``-p no:neuron_readiness``), with it
loaded but not asked for (a plain ``pytest``), and observing (``--neuron-readiness=none``: every
test observed, none failed). Reported: the median wall time of each, the per-round ratio of the
unobserved run to the run without the plugin (target <= 1.03: being installed must not slow a run),
and the seconds observing adds to the run (reported, no target: it is the price of asking; it
includes starting the collection once, which imports torch._dynamo for its compile records).

    python benchmarks/bench_pytest_plugin.py [--json PATH] [--tests N] [--rounds R]
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

import common  # beside this script (sys.path[0])
from targets import target as target_entry

UNOBSERVED_TARGET = 1.03  # a plain pytest run over one without the plugin
TEST = """
def test_{i}():
    x = torch.ones(16, 16, device="neuron")
    assert float((x @ x + {i}).sum()) == 16 * 16 * (16 + {i})
"""
VARIANTS = {"without the plugin": ["-p", "no:neuron_readiness"], "installed, not asked for": [],
            "observing": ["--neuron-readiness=none"]}


def run(folder, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra,
                             "test_many.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"pytest {' '.join(extra)} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return time.perf_counter() - start


def main():
    parser = common.arguments(__doc__, threads=False)
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=8)
    options = parser.parse_args()
    load, t0 = common.load_average(), time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "test_many.py"), "w") as f:
            f.write("import torch\n" + "".join(TEST.format(i=i) for i in range(options.tests)))
        names = list(VARIANTS)
        for name in names:  # warm-up: byte-compiled modules, the page cache
            run(folder, VARIANTS[name])
        seconds = {name: [] for name in names}
        for r in range(options.rounds):
            for name in common.round_order(names, r):
                seconds[name].append(run(folder, VARIANTS[name]))
    unobserved = [a / b for a, b in zip(seconds["installed, not asked for"], seconds["without the plugin"])]
    observing_s = [a - b for a, b in zip(seconds["observing"], seconds["installed, not asked for"])]
    print(f"pytest plugin: {options.tests} small neuron tests, {options.rounds} rounds; "
          f"{common.conditions(load, common.load_average(), time.perf_counter() - t0)}\n")
    rows = [(name, f"{statistics.median(values):.2f} s") for name, values in seconds.items()]
    print(common.markdown_table(["pytest run", "median wall time"], rows, "lr"))
    ratio, (lo, hi) = statistics.median(unobserved), common.quartiles(unobserved)
    met = ratio <= UNOBSERVED_TARGET
    print(f"\ninstalled, not asked for / without the plugin: {ratio:.3f}x (IQR {lo:.3f}-{hi:.3f}; target "
          f"<= {UNOBSERVED_TARGET}x) {common.verdict(met)}")
    print(f"observing adds {statistics.median(observing_s):.2f} s to the run of {options.tests} tests "
          f"(IQR {common.quartiles(observing_s)[0]:.2f}-{common.quartiles(observing_s)[1]:.2f})")
    if options.json:
        common.write_json(options.json, {"seconds": seconds, "tests": options.tests, "targets": [
            target_entry("pytest plugin installed, not asked for, over without it", unobserved, UNOBSERVED_TARGET)],
            "observing_added_s": observing_s})
    common.report_outcome([] if met else ["pytest plugin unobserved ratio"])


if __name__ == "__main__":
    main()
