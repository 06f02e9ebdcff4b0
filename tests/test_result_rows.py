"""The results' typed rows (diagnostics/rows.py, simulate/rows.py): a report's and a plan's
``to_dict`` (their JSON) read back by ``from_dict`` gives the same result, and the same JSON byte
for byte; a written plan read for re-costing gives back the plan it was."""
import copy
import json

import torch

from torch_neuronx import diagnostics
from torch_neuronx.diagnostics.report import Report
from torch_neuronx.runtime import hardware
from torch_neuronx.simulate import numerics, plan as plans, recorded
from torch_neuronx.simulate.graph_overlap import GraphOverlap
from torch_neuronx.simulate.overlap import Backward, Segment
from torch_neuronx.simulate.recorder import Collective, OverCapacity, RankRecord
from torch_neuronx.simulate.rows import Numerics, OutputRow, Simulation, Symmetry
from torch_neuronx.simulate.steps import StepCount

N = "neuron"


def _json(result) -> str:
    return json.dumps(result.to_dict(), indent=1, default=str)


def test_a_reports_dict_reads_back_as_the_same_report(collect):
    w = torch.randn(16, 16, device=N)  # a device-rng finding, with a footnote
    with diagnostics.phase("loop"):
        for _ in range(4):
            (w @ w).sum().item()  # a host sync in a loop
        (w.double() * 2).sum()  # float64
    report = collect()
    assert report.findings and report.sources and report.neffs and report.phases and report.memory
    data = report.to_dict()
    assert Report.from_dict(data) == report and Report.from_dict(data).to_dict() == data
    back = Report.from_dict(json.loads(report.to_json()))  # as a baseline reads report.json
    assert back.to_json() == report.to_json() and back.findings == report.findings


def _records() -> list:
    """Rank 0 with what a plan can say of a rank (steps per token and per sequence, a compiled graph's
    overlap, a DDP backward, an allocation over its HBM, a failure); rank 1 rank 0's relabelled."""
    rec = RankRecord(0, peak_bytes=40 << 30, allocations=3, error="RuntimeError: boom", error_line="train.py:9")
    rec.over = OverCapacity(40 << 30, 1 << 30, "aten::empty", "train.py:8", None)
    rec.collectives = [Collective("all_reduce", (0, 1), 4096, "float32[1024]", "train.py:7", "decode"),
                       Collective("all_reduce", (0, 1), 4096, "float32[1024]", "train.py:7", "train")]
    rec.work = {"decode": {("bf16", 10 ** 9, 10 ** 6): 2}, "train": {("fp32", 10 ** 8, 10 ** 7): 1}}
    rec.launches = {"decode": {"eager": 3}, "train": {"graph": 2}}
    rec.steps = {"decode": StepCount(2, 1, None), "train": StepCount(1, None, 8)}
    rec.overlaps = [Backward("train", [1], [Segment({("fp32", 10 ** 8, 10 ** 6): 1}, 1, 0)])]
    rec.graph_overlaps = [GraphOverlap("train", "g", [("all_reduce", (0, 1), 4096)],
                                       [("collective", 0), ("work", {("bf16", 10 ** 9, 10 ** 6): 1}, (), True)], 2)]
    other = copy.copy(rec)  # as symmetry.relabel_lightly makes it
    other.rank, other.relabelled_from, other.group_map = 1, 0, {(0, 1): (0, 1)}
    return [rec, other]


def test_a_plans_dict_reads_back_as_the_same_plan_and_re_costs_to_it():
    layout = plans.Layout(hardware.INSTANCES["trn2.3xlarge"], 2, 1, 2)
    capacity = hardware.CHIPS["Trainium2"].core_memory(2)
    simulation = Simulation(1.5, 1, Symmetry(used=True, jobs=2, why_every_rank_ran=None, rank0_rank_uses=[]))
    plan = plans.build(_records(), layout, capacity, "/x/train.py", ["--steps", "2"], simulation)
    data = plan.to_dict()
    assert {"over_capacity", "error"} <= set(data["ranks"][0]) and data["ranks"][1]["relabelled_from"] == 0
    assert "per_token_seconds" in data["time"]["steps"]["decode"] and data["time"]["backward_overlap"]
    assert plans.Plan.from_dict(data) == plan and plans.Plan.from_dict(data).to_dict() == data
    written = json.loads(_json(plan))
    assert _json(plans.Plan.from_dict(written)) == _json(plan)
    old = recorded.read(written, "plan.json")
    again = plans.recost(old, layout, capacity, "plan.json")
    assert again.ranks == plan.ranks and again.time == plan.time and again.divergence == plan.divergence
    empty = plans.build([], layout, capacity, "/x/train.py", [], simulation)
    assert empty.time is None and empty.to_dict()["time"] == {} and plans.Plan.from_dict(empty.to_dict()) == empty


def test_a_numerics_plans_dict_reads_back_as_the_same_plan():
    outputs = {"loss": OutputRow([], "float32", 0.0, 0, True, values=[1.5, 1.5], one_device=1.5),
               "w": OutputRow([64, 64], "float32", 1e-7, 1, True)}
    plan = numerics.NumericsPlan(script="/x/train.py", args=[], instance="trn2.3xlarge", lnc=2, nnodes=1,
                                 nproc_per_node=2, world_size=2,
                                 numerics=Numerics(True, outputs, [], "1 x trn2.3xlarge", "rtol 1e-05", 2.0))
    data = plan.to_dict()
    assert "values" in data["numerics"]["outputs"]["loss"] and "values" not in data["numerics"]["outputs"]["w"]
    assert numerics.NumericsPlan.from_dict(data) == plan
    assert _json(numerics.NumericsPlan.from_dict(json.loads(_json(plan)))) == _json(plan)
