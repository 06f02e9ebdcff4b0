"""neuron-ls: the emulated Trainium instance, laid out like AWS's ``neuron-ls``.

One row per Trainium chip (a "neuron device"): its logical NeuronCores, HBM, the chips
it is wired to, and which of its cores this process sees (``NEURON_RT_VISIBLE_CORES`` /
``NEURON_RT_NUM_CORES``; inside a torchrun job, the local rank's core, and the number torch
gives it). Everything comes from :mod:`torch_neuronx.runtime.topology`; unlike the real tool
there are no PCI devices (the BDF addresses are made up), no driver or firmware, and no
processes using the cores.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from torch_neuronx.runtime import hardware, topology
from torch_neuronx.runtime import format_bytes
from torch_neuronx.runtime.units import id_ranges

PROG = "neuron-ls"


def load(environ=None) -> topology.Topology:
    """The topology of the environment, without torch's limit of 127 devices per process:
    neuron-ls lists the whole instance (trn2.48xlarge with LNC=1 has 128 logical cores). Inside a
    torchrun job, the cores are those the rank gets from init_process_group (see :func:`torchrun_env`)."""
    return topology.from_env(torchrun_env(os.environ if environ is None else environ), max_devices=None)


def torchrun_env(environ) -> dict:
    """``environ`` as the neuron backend leaves it once a rank's first group binds it (LOCAL_RANK set,
    NEURON_RT_VISIBLE_CORES not): the local rank's core visible, the launcher's core count dropped."""
    env = dict(environ)
    if "LOCAL_RANK" in env and topology.VISIBLE_CORES_ENV not in env:
        env[topology.VISIBLE_CORES_ENV] = env["LOCAL_RANK"]
        env.pop(topology.NUM_CORES_ENV, None)
    return env


def torchrun_note(topo: topology.Topology, environ) -> str | None:
    """Inside a torchrun job: which core the rank has and the number torch gives it (TorchNeuron's)."""
    if "LOCAL_RANK" not in environ:
        return None
    local_rank, local_world = environ["LOCAL_RANK"], environ.get("LOCAL_WORLD_SIZE", "?")
    where = f"under torchrun (LOCAL_RANK={local_rank} of LOCAL_WORLD_SIZE={local_world})"
    if len(topo.visible_cores) != 1:
        return (f"{where}: {topology.VISIBLE_CORES_ENV} gives this process {len(topo.visible_cores)} cores, and "
                "init_process_group(backend='neuron') refuses more than one per process")
    return (f"{where}: from init_process_group(backend='neuron') on, this process's one NeuronCore is logical core "
            f"{topo.visible_cores[0]}, which torch calls neuron:{local_rank} (torch.neuron.device_count() is "
            f"{local_world}); the other cores are the other ranks'")


def bdf(chip: int) -> str:
    """A made-up, stable PCI address for a chip."""
    return f"0000:{0x10 + chip:02x}:1e.0"


def chips(topo: topology.Topology) -> list[dict]:
    """One dict per chip, in the layout of ``neuron-ls --json-output``."""
    per_chip = topo.logical_cores_per_chip
    visible = set(topo.visible_cores)
    result = []
    for chip in range(topo.instance.chips):
        cores = list(range(chip * per_chip, (chip + 1) * per_chip))
        result.append({
            "neuron_device": chip,
            "bdf": bdf(chip),
            "connected_to": topo.connected_chips(chip),
            "nc_count": per_chip,
            "logical_neuroncore_config": topo.lnc,
            "physical_nc_count": topo.instance.chip.physical_cores,
            "memory_size": topo.instance.chip.hbm_bytes,
            "neuroncore_ids": cores,
            "visible_neuroncore_ids": [core for core in cores if core in visible],
            "memory_per_neuroncore": topo.device_memory,
            "instance_type": topo.instance.name,
            "neuron_processes": [],
        })
    return result


def table(header: list[tuple[str, str]], rows: list[list[str]]) -> str:
    widths = [max(len(h[0]), len(h[1]), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells, centre=False):
        return "| " + " | ".join(c.center(w) if centre else c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([rule, line([h[0] for h in header], True), line([h[1] for h in header], True), rule,
                      *(line(r) for r in rows), rule])


def text(topo: topology.Topology, show_topology: bool) -> str:
    instance = topo.instance
    out = [f"instance-type: {instance.name} (emulated on the host by torch-neuronx-cpu)",
           f"logical-neuroncore-config: {topo.lnc}"]
    header = [("NEURON", "DEVICE"), ("NEURON", "CORES"), ("NEURON", "CORE IDS"), ("NEURON", "MEMORY"),
              ("CONNECTED", "DEVICES"), ("VISIBLE", "CORE IDS")]
    rows = [[str(c["neuron_device"]), str(c["nc_count"]), id_ranges(c["neuroncore_ids"]),
             f"{c['memory_size'] // hardware.GiB} GB", ", ".join(map(str, c["connected_to"])) or "-",
             id_ranges(c["visible_neuroncore_ids"])] for c in chips(topo)]
    out.append(table(header, rows))
    memory = f"memory per logical core: {format_bytes(topo.device_memory)}"
    if topo.memory_overridden:
        out.append(f"{memory} (set by {topology.DEVICE_MEMORY_ENV})")
    else:
        reserved = hardware.RUNTIME_RESERVED_PER_PHYSICAL_CORE // hardware.MiB
        out.append(f"{memory} (HBM share minus the runtime's {reserved} MiB per physical core)")
    note = torchrun_note(topo, os.environ)
    if note is not None:
        out.append(note)
    if len(topo.visible_cores) > topology.MAX_TORCH_DEVICES:
        out.append(f"note: torch can index at most {topology.MAX_TORCH_DEVICES} neuron devices in a process; "
                   f"set {topology.VISIBLE_CORES_ENV} or {topology.NUM_CORES_ENV} to use fewer")
    if show_topology:
        out.append("")
        if instance.switched:
            out.append(f"{instance.name}: {instance.chips} {instance.chip.name} chips wired all-to-all through "
                       "NeuronSwitch-v1")
        elif instance.torus is None:
            out.append(f"{instance.name} has one {instance.chip.name} chip: no chip-to-chip connections.")
        else:
            r, c = instance.torus
            out.append(f"{instance.name}: {instance.chips} {instance.chip.name} chips wired as a {r}x{c} 2D torus")
            width = len(str(instance.chips - 1))
            for chip in range(instance.chips):
                neighbours = ", ".join(map(str, topo.connected_chips(chip)))
                out.append(f"  neuron device {chip:>{width}} <-> {neighbours}")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Show the emulated Trainium instance (chips, NeuronCores, memory) "
                               "that torch-neuronx-cpu presents as the 'neuron' device.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-j", "--json-output", action="store_true", help="print the chips as JSON")
    group.add_argument("-t", "--topology", action="store_true",
                       help="also print how the chips are connected")
    args = parser.parse_args(argv)
    try:
        topo = load()
    except topology.TopologyError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    if args.json_output:
        print(json.dumps(chips(topo), indent=4))
    else:
        print(text(topo, args.topology))
    return 0
