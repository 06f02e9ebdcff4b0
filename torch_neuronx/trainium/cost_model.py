"""What an op call is, for the estimate of its time on a Trainium NeuronCore: the core's peak
rates (:class:`TrainiumProfile`), the op's family, its FLOPs and the bytes it moves. The time itself
is :mod:`.time_model`'s, which the report and the plan share.

FLOPs follow ``torch.utils.flop_counter``'s conventions (its own formulas are called): only
matmuls, convolutions and attention count, a multiply-add is 2 FLOPs, bias adds are free. Bytes are
every tensor argument read plus every result written, each once.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.utils.flop_counter as flop_counter

from torch_neuronx.python_ops.op_classes import base_name
from torch_neuronx.runtime import BACKEND_NAME, hardware

TERA = 1e12


@dataclass(frozen=True)
class TrainiumProfile:
    """The peak rates of one logical NeuronCore (the unit of one ``neuron`` device)."""

    name: str
    chip: str
    lnc: int
    bf16_tflops: float
    fp32_tflops: float
    fp8_tflops: float
    hbm_tb_per_s: float
    source: str

    def peak_flops(self, dtype: torch.dtype | None) -> float:
        if dtype in (torch.bfloat16, torch.float16):
            return self.bf16_tflops * TERA
        if dtype is not None and dtype.is_floating_point and dtype.itemsize == 1:
            return self.fp8_tflops * TERA
        return self.fp32_tflops * TERA

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_per_s * TERA

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def profile_for(chip: str, lnc: int) -> TrainiumProfile:
    """One logical core of ``chip`` at ``lnc``: its share (``lnc`` physical cores) of the chip's peaks."""
    if chip not in hardware.CHIPS:
        raise ValueError(f"no cost profile for chip {chip!r}; known chips: {', '.join(sorted(hardware.CHIPS))}")
    spec = hardware.CHIPS[chip]
    valid = spec.lnc_problem(lnc)
    if valid:
        raise ValueError(f"LNC {lnc} is not valid for {chip}: valid values on {chip} are {valid}")
    share = lnc / spec.physical_cores
    return TrainiumProfile(
        name=f"{chip}, one logical NeuronCore at LNC={lnc} ({lnc}/{spec.physical_cores} of a chip)",
        chip=chip, lnc=lnc, bf16_tflops=spec.bf16_tflops * share, fp32_tflops=spec.fp32_tflops * share,
        fp8_tflops=spec.fp8_tflops * share, hbm_tb_per_s=spec.hbm_tb_per_s * share, source=spec.source)


def parse_profile(text: str) -> TrainiumProfile:
    """'CHIP:LNC' ('Trainium2:2', 'Trainium3:1'; ':LNC' defaults to the chip's default) -> its profile."""
    chip, _, lnc = text.partition(":")
    if lnc and not lnc.strip().isdigit():
        raise ValueError(f"a Trainium profile is CHIP:LNC, e.g. Trainium2:2; got {text!r}")
    chip = chip.strip()
    default = hardware.CHIPS[chip].lnc_values[0] if chip in hardware.CHIPS else 2
    return profile_for(chip, int(lnc) if lnc else default)


def current_profile() -> TrainiumProfile:
    """The profile of the emulated instance (``TORCH_NEURONX_INSTANCE_TYPE``, ``NEURON_LOGICAL_NC_CONFIG``)."""
    from torch_neuronx.runtime import topology

    current = topology.current()
    return profile_for(current.instance.chip.name, current.lnc)


# ---- op families: python_ops/op_classes.py -----------------------------------------------------
# ---- FLOPs and bytes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str

    @staticmethod
    def of(t: torch.Tensor) -> TensorMeta:
        return TensorMeta(tuple(t.shape), t.dtype, t.device.type)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def __str__(self) -> str:
        short = str(self.dtype).replace("torch.", "").replace("float", "f").replace("bfloat", "bf")
        where = "" if self.device == BACKEND_NAME else f"@{self.device}"
        return f"{short}[{', '.join(map(str, self.shape))}]{where}"


def _is_transposed_conv(x: TensorMeta, out: TensorMeta) -> bool:
    # The call does not carry the `transposed` flag here: a transposed convolution upsamples.
    return math.prod(out.shape[2:]) > math.prod(x.shape[2:])


def flops(op: str, inputs: tuple[TensorMeta, ...], results: tuple[TensorMeta, ...]) -> int:
    """FLOPs of one call, by torch.utils.flop_counter's formulas (0 for ops it does not count)."""
    base = base_name(op)
    shapes = [m.shape for m in inputs]
    try:
        if base == "mm":
            return flop_counter.mm_flop(shapes[0], shapes[1])
        if base == "addmm":
            return flop_counter.addmm_flop(shapes[0], shapes[1], shapes[2])
        if base == "bmm":
            return flop_counter.bmm_flop(shapes[0], shapes[1])
        if base == "baddbmm":
            return flop_counter.baddbmm_flop(shapes[0], shapes[1], shapes[2])
        if base in ("convolution_overrideable", "convolution", "_convolution") and results:
            return flop_counter.conv_flop_count(list(shapes[0]), list(shapes[1]), list(results[0].shape),
                                                transposed=_is_transposed_conv(inputs[0], results[0]))
        if base == "convolution_backward_overrideable" and len(inputs) >= 3:
            grad_out, x, w = inputs[:3]
            transposed = _is_transposed_conv(x, grad_out)
            # grad of the input and of the weight (the first two results, when computed): each costs
            # one forward convolution.
            per_grad = flop_counter.conv_flop_count(list(x.shape), list(w.shape), list(grad_out.shape),
                                                    transposed=transposed)
            return per_grad * max(1, min(len(results), 2))
        if "scaled_dot_product" in base or base in ("_flash_attention_forward", "_efficient_attention_forward"):
            if base.endswith("_backward"):
                return flop_counter.sdpa_backward_flop_count(shapes[0], shapes[1], shapes[2], shapes[3])
            return flop_counter.sdpa_flop_count(shapes[0], shapes[1], shapes[2])
    except (IndexError, ValueError, AssertionError, TypeError):
        return 0  # a shape the formula does not take: counted as no FLOPs, like FlopCounterMode
    return 0


def bytes_moved(op: str, inputs: tuple[TensorMeta, ...], results: tuple[TensorMeta, ...]) -> int:
    """Bytes read and written by one call: each tensor argument once, each result once.

    An in-place op without a separate result writes its first argument.
    """
    moved = sum(m.nbytes for m in inputs) + sum(m.nbytes for m in results)
    if not results and inputs and op.split("::", 1)[-1].split(".", 1)[0].endswith("_"):
        moved += inputs[0].nbytes
    return moved


def compute_dtype(inputs: tuple[TensorMeta, ...]) -> torch.dtype | None:
    for m in inputs:
        if m.dtype.is_floating_point:
            return m.dtype
    return inputs[0].dtype if inputs else None


@dataclass(frozen=True)
class OpCost:
    flops: int
    bytes: int
    seconds: float
    bound: str  # "compute" or "memory"


def assumptions(profile: TrainiumProfile) -> list[str]:
    return [
        f"ESTIMATE, not a measurement, of {profile.name}: {profile.bf16_tflops:g} TFLOPS BF16/FP16, "
        f"{profile.fp32_tflops:g} TFLOPS FP32, {profile.hbm_tb_per_s:g} TB/s HBM ({profile.source}).",
        "An op call costs max(FLOPs / reachable peak, bytes / reachable HBM bandwidth) (the fractions of peak are "
        "calibrated, below); launches and compiles are added to it below (first run, each run after).",
        "FLOPs follow torch.utils.flop_counter: only matmuls, convolutions and attention count (2 per "
        "multiply-add); elementwise, normalization and reduction ops are memory-bound (bytes only).",
        "Bytes of an eager call: every tensor argument read once and every result written once (a gather reads "
        "the rows it returns, a scatter writes its source).",
        "FP32 matmuls are costed at the FP32 rate (neuronx-cc's --auto-cast would run them at the BF16 rate).",
        "Host<->device copies and .item() are not in the estimate (they cross the host link, not HBM), "
        "and neither are collectives (NeuronLink/EFA; python -m torch_neuronx.simulate costs them); both are "
        "counted.",
        "Compiled graphs: each call costed as one fused NEFF (a training graph's forward at each call, "
        "its backward graph, as AOTAutograd makes it, at each backward call).",
    ]
