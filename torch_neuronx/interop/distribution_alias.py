"""Answers ``importlib.metadata`` for AWS's distribution name, ``torch-neuronx``, with ours.

Libraries detect TorchNeuron by its distribution, not its import package: diffusers'
``is_torch_neuronx_available()`` asks ``importlib.metadata.version("torch_neuronx")``. Ours is
named ``torch-neuronx-cpu`` (so that a registry never confuses the two), which made that False
and changed what such libraries do, e.g. diffusers skipping its neuron tensor-parallel tests.
Once the backend is registered, a metadata finder answers look-ups of exactly that name with
this package's own metadata and version. It lists nothing when all distributions are listed,
so ``pip list`` and scans of every installed package still see one distribution.
"""
from __future__ import annotations

import importlib.metadata
import sys

OUR_DISTRIBUTION = "torch-neuronx-cpu"
AWS_NAMES = ("torch-neuronx", "torch_neuronx")


class _AliasFinder:
    """A meta path entry that finds no modules, only the aliased distribution."""

    @staticmethod
    def find_spec(*_args, **_kwargs):
        return None

    @staticmethod
    def find_distributions(context=importlib.metadata.DistributionFinder.Context()):
        name = getattr(context, "name", None)
        if name is None or name.lower() not in AWS_NAMES:
            return iter(())
        try:
            return iter((importlib.metadata.distribution(OUR_DISTRIBUTION),))
        except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
            return iter(())


def install() -> None:
    if any(isinstance(entry, _AliasFinder) for entry in sys.meta_path):
        return
    try:
        importlib.metadata.distribution("torch-neuronx")
        return  # a real torch-neuronx distribution is installed: it answers for itself
    except importlib.metadata.PackageNotFoundError:
        pass
    sys.meta_path.append(_AliasFinder())
