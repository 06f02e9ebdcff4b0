"""TorchNeuron's op tracking: which ops ran on neuron, and which a Trainium would run on the CPU.

Counting is always on (one hash-map increment per op call in the core). As in TorchNeuron, the
functions return lists of unique op names as TorchNeuron's dispatcher knows them (``aten::add.Tensor``,
``aten::mm``; an in-place op it runs through its ``.out`` kernel under that name, see
``torchneuron_kernels.tracked_name``); :func:`get_op_counts` adds how often each ran.
"""
from __future__ import annotations

from collections import Counter


from torch_neuronx.diagnostics import observer
from torch_neuronx.python_ops import op_classes, torchneuron_kernels
from torch_neuronx.runtime import ops


def get_op_counts() -> dict[str, int]:
    """Each op that ran on neuron since the last :func:`clear_op_tracking` -> its number of calls."""
    names, calls = ops._op_counts()
    counts: Counter = Counter()
    for name, n in zip(names, calls):
        counts[torchneuron_kernels.tracked_name(name)] += n
    return dict(sorted(counts.items()))


# TorchNeuron's kernels allocate each result through its empty_strided kernel, which its op tracking
# lists; here results adopt the host's memory instead, so the allocation is noted, not counted.
ALLOCATION_OP = "aten::empty_strided"


def get_executed_ops() -> list[str]:
    """The ops that ran on neuron since the last :func:`clear_op_tracking` (sorted, unique). As on
    TorchNeuron, ``aten::empty_strided`` is among them once any op gave a result memory of its own
    (:func:`get_op_counts` and the readiness report count only the ops called)."""
    names = set(get_op_counts())
    if ops._allocated_since_clear():
        names.add(ALLOCATION_OP)
    return sorted(names)


def get_fallback_ops() -> list[str]:
    """The executed ops that TorchNeuron would run on the CPU instead of a NeuronCore (each one's source
    is in ``torch_neuronx.python_ops.host_ops.TABLE``). Every op runs on the host here; these are the
    ones that would cost a host round trip on Trainium."""
    return [name for name in get_op_counts() if is_fallback(name)]


def is_fallback(name: str) -> bool:
    """Whether TorchNeuron runs op ``name`` ('aten::sort.stable') on the CPU (see get_fallback_ops). Not
    native_dropout: its kernel draws the mask on the CPU, but the op is TorchNeuron's (its tests assert
    that it runs on neuron). An op missing from TorchNeuron's kernel list is not enough: the list is read
    from its registries, and some kernels (attention, ...) are registered elsewhere."""
    entry = op_classes.lookup(name)
    return entry is not None and not (torchneuron_kernels.has_kernel(name) and "cpu-random" in entry.sources)


def clear_op_tracking() -> None:
    """Forget the executed ops, and everything diagnostics collected so far."""
    ops._clear_op_counts()
    observer.clear()
