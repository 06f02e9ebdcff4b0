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
    target: str = "trn2"  # the platform target compilers name it by (TorchNeuron's get_platform_target)

    def lnc_problem(self, lnc: int) -> str | None:
        """None when ``lnc`` is an LNC of this chip; else the values it takes ("2 or 1"), for the error
        that names the fix. The one LNC check."""
        return None if lnc in self.lnc_values else " or ".join(str(v) for v in self.lnc_values)

    def core_memory(self, lnc: int) -> int:
        """A logical core's share of the chip's HBM, minus the runtime's reservation."""
        return self.hbm_bytes * lnc // self.physical_cores - lnc * RUNTIME_RESERVED_PER_PHYSICAL_CORE


@dataclass(frozen=True)
class Links:
    """How an instance's chips talk: inside the instance (NeuronLink), to the other instances of its
    UltraServer (NeuronLink), and to any other instance (EFA). Bandwidths in bytes per second."""

    chip_bytes_per_s: float  # NeuronLink bandwidth of one chip inside the instance
    efa_bytes_per_s: float  # EFA bandwidth of the whole instance
    source: str  # where the numbers come from, and which of them are assumptions
    ultraserver_nodes: int = 1  # instances sharing one NeuronLink domain (an UltraServer); 1: none
    ultraserver_chip_bytes_per_s: float = 0.0  # NeuronLink bandwidth of a chip to the other instances
    # Bandwidth between two cores of one chip is not published: taken as the chip's NeuronLink
    # bandwidth (a floor: on-chip traffic does not leave the chip).
    on_chip_assumed: bool = True


GB = 1000**3
_TRN2_LINKS = ("AWS Neuron docs, Amazon EC2 Trn2 architecture: intra-instance NeuronLink-v3 1,024 GB/s per chip, "
               "inter-instance NeuronLink-v3 (Trn2 UltraServer) 256 GB/s per chip, EFAv3 3,200 Gbps per instance")
_TRN3_LINKS = ("AWS Neuron docs, Amazon EC2 Trn3 architecture: NeuronLink-v4 2,048 GiB/s per device through "
               "NeuronSwitch-v1 (all-to-all, inside the server and across the UltraServer); EFA 12,800 Gbps per "
               "Gen1 UltraServer (4 servers: 3,200 Gbps each), 28,800 Gbps per Gen2 UltraServer (36 servers: "
               "800 Gbps each)")
_TRN1_LINKS = ("AWS Neuron docs, Trn1 architecture: Trainium inter-chip interconnect 384 GB/s per chip (Trainium2 "
               "page's comparison table); EFA 800 Gbps (trn1.32xlarge), up to 25 Gbps (trn1.2xlarge)")


@dataclass(frozen=True)
class Instance:
    """An instance type (one host): ``chips`` chips of one kind, wired as a 2D torus (``torus``)
    or all-to-all through a switch (``switched``) when there are several."""

    name: str
    chip: Chip
    chips: int
    torus: tuple[int, int] | None = None  # (rows, cols)
    links: Links | None = None
    switched: bool = False  # NeuronSwitch-v1: every chip reaches every other one directly
    note: str = ""

    def logical_cores(self, lnc: int) -> int:
        return self.chips * self.chip.physical_cores // lnc

    @property
    def family(self) -> str:
        """The Neuron runtime's name of the instance family ("trn2", "trn2u", "trn1", "trn3", ...), which
        TorchNeuron gives as a device's name; an UltraServer's instances end in "u"."""
        family = self.name.split(".")[0].split("-")[0]
        in_ultraserver = self.links is not None and self.links.ultraserver_nodes > 1
        return family + "u" if in_ultraserver and not family.endswith("u") else family


CHIPS: dict[str, Chip] = {c.name: c for c in (
    Chip("Trainium2", "NeuronCore-v3", (3, 0), 8, 96 * GiB, (2, 1), 667.0, 181.0, 1299.0, 2.9,
         "AWS Trn2 specifications: 667 TFLOPS dense BF16, 181 FP32, 1299 FP8, 2.9 TB/s HBM"),
    Chip("Trainium3", "NeuronCore-v4", (4, 0), 8, 144 * GiB, (2, 1), 671.0, 181.0, 2517.0, 4.9,
         "AWS Trn3 specifications: 671 TFLOPS BF16, 2517 MXFP8, 4.9 TB/s HBM; FP32 is not published, "
         "Trainium2's 181 TFLOPS is assumed", target="trn3"),
    Chip("Trainium", "NeuronCore-v2", (2, 0), 2, 32 * GiB, (1,), 190.0, 47.5, 190.0, 0.82,
         "AWS Trn1 instance page (trn1.32xlarge: 16 chips, 3040 TFLOPS BF16, 760 FP32, 13.1 TB/s HBM), "
         "divided by 16; no FP8, BF16 assumed", target="trn1"),
)}

INSTANCES: dict[str, Instance] = {i.name: i for i in (
    Instance("trn2.3xlarge", CHIPS["Trainium2"], 1,
             links=Links(1024 * GB, 200 * GB / 8, _TRN2_LINKS + "; trn2.3xlarge: 200 Gbps network (AWS Trn2 "
                         "instance table)")),
    Instance("trn2.48xlarge", CHIPS["Trainium2"], 16, (4, 4), links=Links(1024 * GB, 3200 * GB / 8, _TRN2_LINKS)),
    # One of the four instances of a Trn2 UltraServer: the same chips, plus NeuronLink to the other three.
    Instance("trn2u.48xlarge", CHIPS["Trainium2"], 16, (4, 4),
             links=Links(1024 * GB, 3200 * GB / 8, _TRN2_LINKS, ultraserver_nodes=4,
                         ultraserver_chip_bytes_per_s=256 * GB)),
    # One Trainium3 chip: not an AWS instance size, the smallest Trn3 unit to emulate.
    Instance("trn3", CHIPS["Trainium3"], 1, note="one Trainium3 chip (no AWS instance of this size)"),
    # The servers of the two Trn3 UltraServers AWS documents (Gen1: 4 servers x 16 chips; Gen2: 36 x 4).
    Instance("trn3-gen1", CHIPS["Trainium3"], 16, switched=True,
             links=Links(2048 * GiB, 3200 * GB / 8, _TRN3_LINKS, ultraserver_nodes=4,
                         ultraserver_chip_bytes_per_s=2048 * GiB),
             note="one of the 4 servers of a Trn3 Gen1 UltraServer"),
    Instance("trn3-gen2", CHIPS["Trainium3"], 4, switched=True,
             links=Links(2048 * GiB, 800 * GB / 8, _TRN3_LINKS, ultraserver_nodes=36,
                         ultraserver_chip_bytes_per_s=2048 * GiB),
             note="one of the 36 servers of a Trn3 Gen2 UltraServer"),
    Instance("trn1.2xlarge", CHIPS["Trainium"], 1, links=Links(384 * GB, 25 * GB / 8, _TRN1_LINKS)),
    Instance("trn1.32xlarge", CHIPS["Trainium"], 16, (4, 4), links=Links(384 * GB, 800 * GB / 8, _TRN1_LINKS)),
)}

# Systems of several instances, by the name AWS gives them: (instance of each node, nodes).
SYSTEMS: dict[str, tuple[str, int]] = {
    "trn2-ultraserver": ("trn2u.48xlarge", 4),
    "trn3-gen1-ultraserver": ("trn3-gen1", 4),
    "trn3-gen2-ultraserver": ("trn3-gen2", 36),
}
