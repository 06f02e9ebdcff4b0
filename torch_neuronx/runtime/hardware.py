"""The one table of Trainium hardware facts, as AWS publishes them: chips, and the instances built
from them. The emulated topology (:mod:`.topology`), ``neuron-ls``, the roofline model and the
readiness report all read it. Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30
MiB = 1 << 20
# The runtime keeps 96 MB of microcode/state per physical NeuronCore out of reach of tensors.
RUNTIME_RESERVED_PER_PHYSICAL_CORE = 96 * MiB


@dataclass(frozen=True)
class Chip:
    """One Trainium chip: its NeuronCores, HBM and peak rates."""

    name: str  # "Trainium2"
    core_arch: str  # "NeuronCore-v3"
    capability: tuple[int, int]  # (major, minor) of the NeuronCore architecture
    physical_cores: int
    hbm_bytes: int
    lnc_values: tuple[int, ...]  # valid NEURON_LOGICAL_NC_CONFIG values; the first is the default
    bf16_tflops: float  # dense BF16/FP16 (TensorEngine)
    fp32_tflops: float
    fp8_tflops: float
    hbm_tb_per_s: float
    source: str  # where the rates come from

    def core_memory(self, lnc: int) -> int:
        """A logical core's share of the chip's HBM, minus the runtime's reservation."""
        return self.hbm_bytes * lnc // self.physical_cores - lnc * RUNTIME_RESERVED_PER_PHYSICAL_CORE


@dataclass(frozen=True)
class Instance:
    """An instance type: ``chips`` chips of one kind, wired as a 2D torus when there are several."""

    name: str
    chip: Chip
    chips: int
    torus: tuple[int, int] | None = None  # (rows, cols)

    def logical_cores(self, lnc: int) -> int:
        return self.chips * self.chip.physical_cores // lnc


CHIPS: dict[str, Chip] = {c.name: c for c in (
    Chip("Trainium2", "NeuronCore-v3", (3, 0), 8, 96 * GiB, (2, 1), 667.0, 181.0, 1299.0, 2.9,
         "AWS Trn2 specifications: 667 TFLOPS dense BF16, 181 FP32, 1299 FP8, 2.9 TB/s HBM"),
    Chip("Trainium3", "NeuronCore-v4", (4, 0), 8, 144 * GiB, (2, 1), 671.0, 181.0, 2517.0, 4.9,
         "AWS Trn3 specifications: 671 TFLOPS BF16, 2517 MXFP8, 4.9 TB/s HBM; FP32 is not published, "
         "Trainium2's 181 TFLOPS is assumed"),
    Chip("Trainium", "NeuronCore-v2", (2, 0), 2, 32 * GiB, (1,), 190.0, 47.5, 190.0, 0.82,
         "AWS Trn1 instance page (trn1.32xlarge: 16 chips, 3040 TFLOPS BF16, 760 FP32, 13.1 TB/s HBM), "
         "divided by 16; no FP8, BF16 assumed"),
)}

INSTANCES: dict[str, Instance] = {i.name: i for i in (
    Instance("trn2.3xlarge", CHIPS["Trainium2"], 1),
    Instance("trn2.48xlarge", CHIPS["Trainium2"], 16, (4, 4)),
    Instance("trn3", CHIPS["Trainium3"], 1),
    Instance("trn1.2xlarge", CHIPS["Trainium"], 1),
    Instance("trn1.32xlarge", CHIPS["Trainium"], 16, (4, 4)),
)}
