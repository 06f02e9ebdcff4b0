"""Time on Trainium, one model for the readiness report (one device) and the plan (every rank).

An op call costs max(FLOPs / (peak x compute fraction), HBM bytes / (HBM bandwidth x HBM
fraction)), plus its launch: an eager op's NEFF launch (mm: one per tile), or one launch per call
of a compiled graph. A compiled graph is one fused NEFF: its ops move to and from HBM only the
graph's inputs (read once per call) and its outputs (written once); the intermediates between its
ops stay on chip, tiled through the core's SRAM by the compiler (:class:`FusedAccount`). A
collective costs a fixed cost per call, its ring steps times the per-step latency of the slowest
link its group crosses, and its bytes over that link's bandwidth times the link's fraction. A
step's time is one estimate: its compute, launches and collectives, less what is known to run
under the compute (a backward's gradient buckets); the collectives fully hidden and not hidden at
all are its bounds, and the out-of-sample error of the model on AWS's published rows its interval.

The peaks and bandwidths are AWS's published figures (:mod:`torch_neuronx.runtime.hardware`).
The fractions, the collective's fixed cost and the NeuronLink step latency are not published:
they are fitted to AWS's published end-to-end rows (:data:`CALIBRATION`; the rows, the fit and
each row's held-out error are in docs/step-time.md).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter

import torch

from torch_neuronx.trainium import cost_model, neff_forecast
from torch_neuronx.trainium.cost_model import TensorMeta, TrainiumProfile
from torch_neuronx.python_ops import op_classes

NEURONLINK, EFA = "NeuronLink", "EFA"


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The constants AWS does not publish: fitted to its published rows, or assumed (and said so)."""

    compute_fraction: float  # of the TensorEngine's peak that matmuls, convolutions and attention reach
    hbm_fraction: float  # of the published HBM bandwidth that memory-bound work reaches (decode's weights)
    link_fraction: dict  # of a link's published bandwidth that a collective's bytes reach: by chip (its
    # NeuronLink generation), and EFA
    collective_s: float  # each collective call, whatever its size or group: its launch and synchronization
    step_latency_s: dict  # per ring step of a collective, by link kind (NEURONLINK, EFA)
    eager_launch_s: float  # one eager NEFF launch
    graph_launch_s: float  # one compiled graph (NEFF) launch
    held_out: tuple[float, float]  # the fastest and slowest held-out prediction / AWS's figure over the rows
    fitted_to: tuple[str, ...]  # the rows the constants are fitted to

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def link(self, link: str, chip: str) -> float:
        """The fraction of ``link``'s bandwidth (a plan's link name) collectives reach on ``chip``'s instances."""
        if link == EFA:
            return self.link_fraction[EFA]
        return self.link_fraction.get(chip, self.link_fraction[DEFAULT_LINK_CHIP])

    def interval(self, seconds: float) -> tuple[float, float]:
        """Where AWS's figure fell around a prediction of ``seconds``, held out (the rows' error)."""
        return seconds / self.held_out[1], seconds / self.held_out[0]


def _geometric_mean(pair: tuple[float, float]) -> float:
    return math.sqrt(pair[0] * pair[1])


DEFAULT_LINK_CHIP = "Trainium2"  # a chip without rows of its own (Trainium3) takes Trainium2's NeuronLink fraction
# Fitted (benchmarks/bench_step_time.py, on full-size plans; torch_neuronx/simulate/fit.py) to the rows
# of torch_neuronx/trainium/calibration.py, each through a program of its shape, and rounded to two
# digits; held out one at a time, the rows fell within held_out of the predictions (docs/step-time.md).
# EFA's fraction and step latency are assumed: the training rows' EFA transfers are 0.1% (8B) and 4% (7B)
# of their step at these values, too little for the rows to fix them.
CALIBRATION = Calibration(
    compute_fraction=0.62,
    hbm_fraction=1.0,
    link_fraction={"Trainium": 0.18, "Trainium2": 0.60, EFA: 0.5},
    collective_s=85e-6,
    step_latency_s={NEURONLINK: 17e-9, EFA: 15e-6},
    eager_launch_s=_geometric_mean(neff_forecast.EAGER_LAUNCH_SECONDS),
    graph_launch_s=_geometric_mean(neff_forecast.GRAPH_LAUNCH_SECONDS),
    held_out=(0.75, 1.39),  # 0.753-1.380, rounded outward
    fitted_to=(
        "Llama-3.3-70B-Instruct TPOT 19.6 ms, 1 x trn2.48xlarge, TP=64",
        "Llama-3.3-70B-Instruct TTFT 814.2 ms, 1 x trn2.48xlarge, TP=64",
        "Llama-3.1-405B-Instruct TPOT 37.9 ms, 1 x trn2.48xlarge, TP=64",
        "Llama-3.1-405B-Instruct TTFT 2442 ms, 1 x trn2.48xlarge, TP=64",
        "Llama-3-70B TPOT 24.48 ms, 1 x trn1.32xlarge, TP=32",
        "Llama-3-70B TPOT, batch 4 28.38 ms, 1 x trn1.32xlarge, TP=32",
        "Llama-3-70B TTFT 547 ms, 1 x trn1.32xlarge, TP=32",
        "Llama-2-7b TPOT 6.69956 ms, 1 x trn1.32xlarge, TP=32",
        "Llama-2-7b TPOT, batch 8 10.0951 ms, 1 x trn1.32xlarge, TP=32",
        "Llama-3.1-8B pre-training 47.95 sequences/s, 32 x trn1.32xlarge, TP=32 DP=32 PP=1, ZeRO-1",
        "Llama2-7B pre-training 95.14 sequences/s, 16 x trn1.32xlarge, TP=8 DP=64, ZeRO-1",
    ),
)

# Ring steps of a collective over n ranks (latency terms); broadcast, reduce and barrier as trees.
_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_reduce_coalesced": lambda n: 2 * (n - 1),
          "send": lambda n: 1, "recv": lambda n: 1}
_TREE = ("broadcast", "reduce", "barrier")
# Bytes moved per byte of the call's buffer (ring algorithms).
_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n, "all_reduce_coalesced": lambda n: 2 * (n - 1) / n,
    "barrier": lambda n: 0.0, "send": lambda n: 1.0, "recv": lambda n: 1.0,
    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0,
}


def precision(dtype: torch.dtype | None) -> str:
    """The TensorEngine rate a call runs at: 'bf16' (BF16/FP16), 'fp8' or 'fp32'."""
    if dtype in (torch.bfloat16, torch.float16):
        return "bf16"
    if dtype is not None and dtype.is_floating_point and dtype.itemsize == 1:
        return "fp8"
    return "fp32"


_PRECISION_DTYPE = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "fp32": torch.float32}


def work_seconds(profile: TrainiumProfile, prec: str, flops: int, nbytes: int,
                 cal: Calibration = CALIBRATION) -> float:
    """The time of one call's work: compute or memory, whichever is longer."""
    compute = flops / (profile.peak_flops(_PRECISION_DTYPE[prec]) * cal.compute_fraction) if flops else 0.0
    return max(compute, nbytes / (profile.hbm_bytes_per_s * cal.hbm_fraction))


# A gather reads of its table only the rows it returns; a scatter into a tensor writes only its source.
GATHERS = {"embedding", "index_select", "index", "_unsafe_index", "gather"}
SCATTERS = {"index_copy", "index_copy_", "index_put", "index_put_", "_index_put_impl", "_index_put_impl_",
            "scatter", "scatter_", "scatter_add", "scatter_add_", "slice_scatter", "select_scatter", "index_add",
            "index_add_"}


def _hbm_bytes(op: str, inputs: tuple[TensorMeta, ...], results: tuple[TensorMeta, ...]) -> int:
    base = op_classes.base_name(op)
    if base in GATHERS and inputs and results:
        return sum(m.nbytes for m in inputs[1:]) + 2 * sum(m.nbytes for m in results)
    if base in SCATTERS and len(inputs) > 1:
        return 2 * sum(m.nbytes for m in inputs[1:])
    return cost_model.bytes_moved(op, inputs, results)


def op_work(op: str, inputs: tuple[TensorMeta, ...], results: tuple[TensorMeta, ...]) -> tuple[str, int, int]:
    """(precision, FLOPs, HBM bytes) of one eager call: every argument read, every result written
    (a gather reads only the rows it returns, a scatter writes only its source)."""
    return (precision(cost_model.compute_dtype(inputs)), cost_model.flops(op, inputs, results),
            _hbm_bytes(op, inputs, results))


def cost(profile: TrainiumProfile, prec: str, flops: int, nbytes: int,
         cal: Calibration = CALIBRATION) -> cost_model.OpCost:
    """One call's work as the report shows it: FLOPs, bytes, seconds and what bounds it."""
    seconds = work_seconds(profile, prec, flops, nbytes, cal)
    memory = nbytes / (profile.hbm_bytes_per_s * cal.hbm_fraction)
    return cost_model.OpCost(flops, nbytes, seconds, "compute" if seconds > memory else "memory")


def op_cost(profile: TrainiumProfile, op: str, inputs: tuple[TensorMeta, ...], results: tuple[TensorMeta, ...],
            cal: Calibration = CALIBRATION) -> cost_model.OpCost:
    """The time of one eager call on ``profile``."""
    return cost(profile, *op_work(op, inputs, results), cal)


@functools.lru_cache(maxsize=65536)
def eager_launches(op: str, inputs: tuple[TensorMeta, ...]) -> int:
    """NEFF launches of one eager call (the NEFF forecast's rule: mm once per tile, views none)."""
    return sum(n.launches for n in neff_forecast.eager_neffs(op, inputs, 1))


class FusedAccount:
    """The HBM traffic of one call of a compiled graph (one NEFF), op by op.

    Tensors are told apart by a key (a storage's id, an FX node's name). The graph's inputs live
    in HBM: each is read at its first use (a gather reads only the rows it returns). A scatter
    into an input (a KV cache's update) writes its source there, and what it returns is that input
    again, read from HBM at its first use. Intermediates stay on chip (the compiler tiles them
    through SRAM); the graph's outputs are written once (:meth:`finish`)."""

    def __init__(self):
        self.unread: dict = {}  # graph inputs (and inputs updated in place) not read yet: key -> bytes
        self.in_hbm: set = set()  # every key that lives in HBM: inputs and their in-place updates

    def add_input(self, key, nbytes: int) -> None:
        self.unread[key] = nbytes
        self.in_hbm.add(key)

    def _read(self, key, limit: int | None = None) -> int:
        if key not in self.unread:
            return 0
        nbytes = self.unread.pop(key)
        return nbytes if limit is None else min(nbytes, limit)

    def op(self, op: str, inputs: list[tuple[object, TensorMeta]], results: list[tuple[object, TensorMeta]]):
        """(precision, FLOPs, HBM bytes) of one op inside the graph."""
        metas_in = tuple(m for _, m in inputs)
        metas_out = tuple(m for _, m in results)
        base = op_classes.base_name(op)
        work = (precision(cost_model.compute_dtype(metas_in)), cost_model.flops(op, metas_in, metas_out))
        if base in SCATTERS and inputs and inputs[0][0] in self.in_hbm:
            nbytes = 2 * sum(m.nbytes for _, m in inputs[1:])
            for key, meta in results:  # the input itself, updated where it lives
                self.unread[key] = meta.nbytes
                self.in_hbm.add(key)
            return (*work, nbytes)
        if base in ("copy", "copy_") and len(inputs) == 2 and inputs[1][0] in self.in_hbm \
                and inputs[0][0] in self.in_hbm:
            return (*work, 0)  # an input's in-place update written back to it: already there
        gathered = sum(m.nbytes for _, m in results) if base in GATHERS else None
        return (*work, sum(self._read(key, gathered if i == 0 else None) for i, (key, _) in enumerate(inputs)))

    def finish(self, outputs: list[tuple[object, TensorMeta]]) -> int:
        """Bytes the graph's outputs write to HBM (those not there already)."""
        seen, nbytes = set(), 0
        for key, meta in outputs:
            if key not in seen and key not in self.in_hbm:
                nbytes += meta.nbytes
            seen.add(key)
        return nbytes


def keyed_metas(tensors) -> list[tuple[int, TensorMeta]]:
    """(storage key, meta) of each tensor: what :class:`FusedAccount` tells tensors apart by."""
    return [(t.untyped_storage()._cdata, TensorMeta.of(t)) for t in tensors if isinstance(t, torch.Tensor)]


# ---- collectives -------------------------------------------------------------------------------
def link_kind(link: str) -> str:
    """The latency class of a link the plan names ('EFA', 'NeuronLink', 'on chip (assumed)', ...)."""
    return EFA if link == EFA else NEURONLINK


def collective_seconds(op: str, nbytes: int, n: int, bandwidth: float, link: str, chip: str,
                       cal: Calibration = CALIBRATION) -> tuple[float, float]:
    """(latency, transfer) seconds of one collective over ``n`` ranks on ``link`` at ``bandwidth``
    bytes/s per rank, on ``chip``'s instances: latency is its fixed cost plus its ring steps', the part
    its size does not change."""
    if n <= 1 or bandwidth <= 0:
        return 0.0, 0.0
    steps = math.ceil(math.log2(n)) if op in _TREE else _STEPS.get(op, lambda n: n - 1)(n)
    factor = _FACTOR.get(op, lambda n: (n - 1) / n)(n)
    latency = cal.collective_s + steps * cal.step_latency_s[link_kind(link)]
    return latency, factor * nbytes / (bandwidth * cal.link(link, chip))


# ---- a stretch of work: its time ---------------------------------------------------------------
@dataclasses.dataclass
class Span:
    """What a stretch of a run costs: compute, launches and collectives, each in seconds."""

    compute_s: float = 0.0
    eager_launches: int = 0
    graph_launches: int = 0
    comm_latency_s: float = 0.0  # the collectives' fixed costs and ring steps
    comm_transfer_s: float = 0.0
    comm_calls: int = 0
    hidden_s: float = 0.0  # of the collectives' time, what runs under the backward's compute (DDP's buckets)

    def add(self, other: Span) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def comm_s(self) -> float:
        return self.comm_latency_s + self.comm_transfer_s

    def launch_s(self, cal: Calibration = CALIBRATION) -> float:
        return self.eager_launches * cal.eager_launch_s + self.graph_launches * cal.graph_launch_s

    def seconds(self, cal: Calibration = CALIBRATION) -> float:
        """The estimate: compute, launches and collectives one after another, but for what is known
        to run under the backward's compute (``hidden_s``): a collective whose result the next op
        needs (tensor parallelism's) cannot overlap it."""
        return self.compute_s + self.launch_s(cal) + self.comm_s - self.hidden_s

    def bounds(self, cal: Calibration = CALIBRATION) -> tuple[float, float]:
        """(every collective hidden under the compute, none hidden): what overlap could move it."""
        busy = self.compute_s + self.launch_s(cal)
        return max(busy, self.comm_s), busy + self.comm_s


def overlapped_seconds(launches) -> float:
    """Of collectives launched one after another while compute goes on, each given as (its seconds,
    the compute seconds left after its launch), the seconds hidden under that compute: they run one
    at a time, each from its launch or the end of the one before; what runs past the compute's end
    shows."""
    end, total = float("-inf"), 0.0
    for seconds, left in launches:
        end = max(-left, end) + seconds
        total += seconds
    return total - max(0.0, end) if total else 0.0


def _fill(gaps: list, compute: float, until: float) -> float:
    """Run the waiting work of ``gaps`` ([available from, seconds left]) on the compute engine from
    ``compute`` until ``until``; returns when the engine stops."""
    for item in gaps:
        start = max(compute, item[0])
        if start >= until:
            break
        run = min(item[1], until - start)
        item[1] -= run
        compute = start + run
    gaps[:] = [item for item in gaps if item[1] > 0]
    return compute


def scheduled_hidden(events, work_seconds_of, collective_seconds_of) -> float:
    """Of one compiled graph call's collectives, the seconds they run under its compute. ``events``
    in call order: ("collective", i), or ("work", work, the collectives whose result it reads, whether
    it feeds no later collective). The links run the collectives one at a time, each from its launch;
    the compute engine runs the work that feeds a collective in order, waiting for the results it
    reads, and the rest whenever it would wait; the call ends when both are done."""
    compute = link = busy = comm = 0.0
    done, gaps = {}, []
    for event in events:
        if event[0] == "collective":
            seconds = collective_seconds_of(event[1])
            link = done[event[1]] = max(compute, link) + seconds
            comm += seconds
            continue
        seconds = work_seconds_of(event[1])
        ready = max([compute, *(done[i] for i in event[2])])
        busy += seconds
        if event[3]:  # fills a gap: from when its inputs are ready
            gaps.append([ready, seconds])
        else:
            compute = _fill(gaps, compute, ready)
            compute = max(compute, ready) + seconds
    compute = _fill(gaps, compute, math.inf)
    return busy + comm - max(compute, link)


def work_span(profile: TrainiumProfile, work: Counter, cal: Calibration = CALIBRATION) -> float:
    """Compute seconds of ``work``: {(precision, flops, bytes): calls}."""
    return sum(calls * work_seconds(profile, prec, f, b, cal) for (prec, f, b), calls in work.items())


def launches_seconds(eager: int, graphs: int, cal: Calibration = CALIBRATION) -> float:
    """The launches of ``eager`` eager NEFFs and ``graphs`` compiled graph calls."""
    return eager * cal.eager_launch_s + graphs * cal.graph_launch_s


def _percent(fraction: float) -> str:
    return f"{fraction:.0%}"


def assumptions(cal: Calibration = CALIBRATION) -> list[str]:
    lat, links = cal.step_latency_s, cal.link_fraction
    nl = ", ".join(f"{_percent(v)} on {chip}'s NeuronLink" for chip, v in links.items() if chip != EFA)
    return [
        f"Not published, fitted to AWS's published rows: matmuls, convolutions and attention reach "
        f"{_percent(cal.compute_fraction)} of the TensorEngine's peak; memory-bound work (decode's weights and KV "
        f"cache) {_percent(cal.hbm_fraction)} of the HBM bandwidth; a collective's bytes {nl} ("
        f"{DEFAULT_LINK_CHIP}'s for a chip without rows) and {_percent(links[EFA])} over EFA (assumed); each "
        f"collective call costs {cal.collective_s * 1e6:.3g} µs whatever its size, plus {lat[NEURONLINK] * 1e9:.3g} ns "
        f"per ring step over NeuronLink and {lat[EFA] * 1e6:g} µs over EFA (assumed). Held out one at a time, AWS's "
        f"rows fell within {cal.held_out[0]:.2f}x to {cal.held_out[1]:.2f}x of the prediction: the estimate's "
        "interval. Rows: " + "; ".join(cal.fitted_to) + ". Those are AWS's own optimized stacks (NxD Inference, "
        "Transformers NeuronX, NxD Training); an unchanged PyTorch program is costed by what it runs (eager ops each "
        "launched, compiled graphs fused).",
        f"Launches (no published figure): {cal.eager_launch_s * 1e6:.3g} µs per eager NEFF launch and "
        f"{cal.graph_launch_s * 1e6:.3g} µs per compiled graph launch, the geometric middle of the ranges "
        f"{neff_forecast.EAGER_LAUNCH_SECONDS[0] * 1e6:g}-{neff_forecast.EAGER_LAUNCH_SECONDS[1] * 1e6:g} µs and "
        f"{neff_forecast.GRAPH_LAUNCH_SECONDS[0] * 1e6:g}-{neff_forecast.GRAPH_LAUNCH_SECONDS[1] * 1e6:g} µs.",
        "A compiled graph is one fused NEFF: only its inputs (read once; a gather reads the rows it returns) and its "
        "outputs cross HBM; its intermediates stay on chip, tiled through SRAM by the compiler.",
        "Collectives: ring algorithms (all_reduce 2(n-1) steps moving 2(n-1)/n of the buffer, all_gather, "
        "reduce_scatter and all_to_all n-1 steps moving (n-1)/n; broadcast, reduce, barrier log2(n) steps) over "
        "the slowest link the group crosses, its bandwidth shared by the group's ranks on it.",
        "A step's estimate runs compute, launches and collectives one after another: a collective whose result the "
        "next op needs (tensor parallelism's) cannot overlap. Collectives a backward launches without waiting (DDP's "
        "gradient buckets, from their gradient hooks) run one after another, each from its launch, under the "
        "backward compute that follows it; only what runs past the backward's end counts. Its bounds (details): "
        "every collective hidden under the compute, and none.",
    ]
