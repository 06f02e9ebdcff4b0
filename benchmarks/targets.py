"""The performance targets `make bench` checks, and the one table that reports them all.

Each benchmark script adds a "targets" list to its --json file, one entry per target, made by
`target()` from the per-round values of one interleaved run. `python benchmarks/targets.py
FILE...` prints every entry of those files as one table: the median, its spread over the rounds
(the interquartile range and the extremes) and whether the median meets the limit.
"""
import json
import statistics
import sys

import common  # beside this file (sys.path[0]); it imports no torch and re-execs nothing


def target(name, per_round, limit, higher_is_better=False, unit="x"):
    """One target's entry: `per_round` holds the value (a ratio, or µs) measured in each round."""
    values = sorted(per_round)
    if not values:
        return {"name": name, "rounds": 0, "limit": limit, "unit": unit, "pass": False,
                "higher_is_better": higher_is_better, "error": "no measurement"}
    if len(values) >= 4:
        q1, q3 = common.quartiles(values)
    else:
        q1, q3 = values[0], values[-1]
    median = statistics.median(values)
    met = median >= limit if higher_is_better else median <= limit
    return {"name": name, "median": median, "q1": q1, "q3": q3, "min": values[0], "max": values[-1],
            "rounds": len(values), "limit": limit, "unit": unit, "higher_is_better": higher_is_better,
            "pass": met}


def _number(value, unit):
    return f"{value:.3f}x" if unit == "x" else f"{value:+.2f} {unit}" if unit == "µs" else f"{value:.3g} {unit}"


def table(entries):
    rows = []
    for e in entries:
        limit = ("≥ " if e["higher_is_better"] else "≤ ") + _number(e["limit"], e["unit"])
        if "error" in e:
            rows.append([e["name"], "—", e["error"], 0, limit, "MISS"])
            continue
        spread = (f"{_number(e['q1'], e['unit'])}–{_number(e['q3'], e['unit'])} "
                  f"[{_number(e['min'], e['unit'])}, {_number(e['max'], e['unit'])}]")
        rows.append([e["name"], _number(e["median"], e["unit"]), spread, e["rounds"], limit, common.verdict(e["pass"])])
    return common.markdown_table(["target", "median", "spread over rounds: IQR [min, max]", "rounds", "limit",
                                  "result"], rows, align="lrlrll")


def main(paths):
    entries, missing = [], []
    for path in paths:
        try:
            with open(path) as f:
                entries += json.load(f).get("targets", [])
        except (OSError, ValueError) as e:
            missing.append(f"{path}: {e}")
    print(table(entries))
    for m in missing:
        print(f"(not read: {m})")
    met = sum(e["pass"] for e in entries)
    print(f"\n{met} of {len(entries)} targets met.")


if __name__ == "__main__":
    main(sys.argv[1:])
