"""Time on Trainium, one model for the readiness report (one device) and the plan (every rank).

An op call costs max(FLOPs / (peak x compute fraction), HBM bytes / (HBM bandwidth x bandwidth
fraction)), plus its launch: an eager op's NEFF launch (mm: one per tile), or one launch per call
of a compiled graph. A compiled graph is one fused NEFF: its ops move to and from HBM only the
graph's inputs (read once per call) and its outputs (written once); the intermediates between its
ops stay on chip, tiled through the core's SRAM by the compiler (:class:`FusedAccount`). A
collective costs its ring steps times the per-step latency of the slowest link its group
crosses plus its bytes over that link's bandwidth (x the bandwidth fraction). A step's time is a
range: collectives fully overlapped with compute (low) or not at all (high).

The peaks and bandwidths are AWS's published figures (:mod:`torch_neuronx.runtime.hardware`).
The fractions, the per-step latencies and the launch costs are not published: they are fitted to
AWS's published end-to-end measurements (:data:`CALIBRATION`; the fit is in docs/step-time.md).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter

import torch

from torch_neuronx.diagnostics import cost_model, neff_forecast
from torch_neuronx.diagnostics.cost_model import TensorMeta, TrainiumProfile
from torch_neuronx.python_ops import op_classes

NEURONLINK, EFA = "NeuronLink", "EFA"


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The constants AWS does not publish, fitted to its published measurements."""

    compute_fraction: float  # of the TensorEngine's peak that matmuls, convolutions and attention reach
    bandwidth_fraction: float  # of the published HBM and link bandwidths that transfers reach
    step_latency_s: dict  # per ring step of a collective, by link kind (NEURONLINK, EFA)
    eager_launch_s: tuple[float, float]  # one eager NEFF launch: (low, high)
    graph_launch_s: tuple[float, float]  # one compiled graph (NEFF) launch: (low, high)
    fitted_to: tuple[str, ...]  # the measurements the constants reproduce

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# Fitted (docs/step-time.md, benchmarks/bench_step_time.py --fit, on full-size plans): the three
# constants minimizing the largest ratio between the no-overlap end of the plan and AWS's figures below. EFA's step latency is
# not fitted (AWS's training figure barely depends on it): a typical RDMA round trip, assumed.
CALIBRATION = Calibration(
    compute_fraction=0.60,
    bandwidth_fraction=0.50,
    step_latency_s={NEURONLINK: 0.55e-6, EFA: 15e-6},
    eager_launch_s=neff_forecast.EAGER_LAUNCH_SECONDS,
    graph_launch_s=neff_forecast.GRAPH_LAUNCH_SECONDS,
    fitted_to=(
        "Llama-3.3-70B, NxD Inference, trn2.48xlarge TP=64 LNC=2, batch 1, input 10,000 / output 1,500, BF16: "
        "TTFT P50 814.2 ms, TPOT P50 19.6 ms (aws-neuron-sdk libraries/nxd-inference/tutorials/"
        "llama70b_perf_comparison.csv)",
        "Llama-3.1-8B pre-training, 32 x trn1.32xlarge TP=32 DP=32, seq 8192, global batch 1024, BF16 autocast, "
        "FP32 optimizer, ZeRO-1: 47.95 sequences/s (aws-neuron-sdk about-neuron/benchmarks/trn1/"
        "training_data_decoder.csv)",
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
    return max(compute, nbytes / (profile.hbm_bytes_per_s * cal.bandwidth_fraction))


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
    memory = nbytes / (profile.hbm_bytes_per_s * cal.bandwidth_fraction)
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


def collective_seconds(op: str, nbytes: int, n: int, bandwidth: float, link: str,
                       cal: Calibration = CALIBRATION) -> tuple[float, float]:
    """(latency, transfer) seconds of one collective over ``n`` ranks on ``link`` at ``bandwidth``
    bytes/s per rank."""
    if n <= 1 or bandwidth <= 0:
        return 0.0, 0.0
    steps = math.ceil(math.log2(n)) if op in _TREE else _STEPS.get(op, lambda n: n - 1)(n)
    factor = _FACTOR.get(op, lambda n: (n - 1) / n)(n)
    return steps * cal.step_latency_s[link_kind(link)], factor * nbytes / (bandwidth * cal.bandwidth_fraction)


# ---- a stretch of work: its range --------------------------------------------------------------
@dataclasses.dataclass
class Span:
    """What a stretch of a run costs: compute, launches and collectives, each in seconds."""

    compute_s: float = 0.0
    eager_launches: int = 0
    graph_launches: int = 0
    comm_latency_s: float = 0.0
    comm_transfer_s: float = 0.0
    hidden_s: float = 0.0  # of the collectives' time, what runs under the backward's compute (DDP's buckets)

    def add(self, other: Span) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def comm_s(self) -> float:
        return self.comm_latency_s + self.comm_transfer_s

    def launch_s(self, cal: Calibration = CALIBRATION) -> tuple[float, float]:
        return tuple(self.eager_launches * e + self.graph_launches * g
                     for e, g in zip(cal.eager_launch_s, cal.graph_launch_s))

    def seconds(self, cal: Calibration = CALIBRATION) -> tuple[float, float]:
        """(low, high): collectives hidden under compute, or after it (but for what is known to run
        under the backward: ``hidden_s``)."""
        low_launch, high_launch = self.launch_s(cal)
        return (max(self.compute_s + low_launch, self.comm_s),
                self.compute_s + high_launch + self.comm_s - self.hidden_s)


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


def work_span(profile: TrainiumProfile, work: Counter, cal: Calibration = CALIBRATION) -> float:
    """Compute seconds of ``work``: {(precision, flops, bytes): calls}."""
    return sum(calls * work_seconds(profile, prec, f, b, cal) for (prec, f, b), calls in work.items())


def assumptions(cal: Calibration = CALIBRATION) -> list[str]:
    lat = cal.step_latency_s
    return [
        f"Calibrated, not published: matmuls, convolutions and attention reach {cal.compute_fraction:.0%} of the "
        f"TensorEngine's peak; HBM and link transfers {cal.bandwidth_fraction:.0%} of their published bandwidth; "
        f"a collective's ring step costs {lat[NEURONLINK] * 1e6:g} µs over NeuronLink (and between the cores of a "
        f"chip) and {lat[EFA] * 1e6:g} µs over EFA. Fitted to: " + "; ".join(cal.fitted_to) + ". Those figures are "
        "AWS's own optimized stacks (NxD Inference, NxD Training), compiled whole; an unchanged PyTorch program "
        "is costed by what it runs (eager ops each launched, compiled graphs fused).",
        "A compiled graph is one fused NEFF: only its inputs (read once; a gather reads the rows it returns) and its "
        "outputs cross HBM; its intermediates stay on chip, tiled through SRAM by the compiler.",
        "Collectives: ring algorithms (all_reduce 2(n-1) steps moving 2(n-1)/n of the buffer, all_gather, "
        "reduce_scatter and all_to_all n-1 steps moving (n-1)/n; broadcast, reduce, barrier log2(n) steps) over "
        "the slowest link the group crosses, its bandwidth shared by the group's ranks on it.",
        "A step's range: collectives fully overlapped with compute (low) or not at all (high); a collective whose "
        "result the next op needs (tensor parallelism) cannot overlap, so the high end is the likely one there. "
        "Collectives a backward launches without waiting (DDP's gradient buckets, from their gradient hooks) run "
        "one after another, each from its launch, under the backward compute that follows it; only what runs past "
        "the backward's end counts in the high end too.",
    ]
