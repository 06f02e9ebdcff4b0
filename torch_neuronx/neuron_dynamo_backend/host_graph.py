"""Dynamo's graph of neuron tensors made a CPU graph, for Inductor to compile as it compiles any.

Device literals and every value's metadata move to CPU, so Inductor's caches (FX graph,
AOTAutograd) apply. Tensors Dynamo installs as graph attributes (optimizer state, parameters,
buffers, free tensors) are lifted to inputs, so at run time they are passed like any argument
(:mod:`.bridge`). Example inputs become CPU fakes that share storages exactly as the neuron
inputs do.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Sequence

import torch
import torch.fx

from torch_neuronx.runtime import BACKEND_NAME

_CPU = torch.device("cpu")


def _is_neuron_device_string(value: Any) -> bool:
    return isinstance(value, str) and (value == BACKEND_NAME or value.startswith(BACKEND_NAME + ":"))


def _to_cpu_device(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == BACKEND_NAME or _is_neuron_device_string(value):
        return _CPU
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu_device(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu_device(v) for k, v in value.items()}
    return value


def _cpu_fake(value: Any, fake_mode, keep_grad: bool = False) -> Any:
    """A CPU fake with the metadata of a neuron (fake) tensor; anything else unchanged."""
    if not isinstance(value, torch.Tensor) or value.device.type != BACKEND_NAME:
        return value
    with fake_mode:
        cpu = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=_CPU)
        if value.storage_offset():
            cpu = cpu.as_strided(value.shape, value.stride(), value.storage_offset())
    if keep_grad and value.requires_grad:
        cpu.requires_grad_(True)
    return cpu


def is_collective(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls a c10d collective (functional or not, its wait included)."""
    return node.op == "call_function" and "c10d" in str(getattr(node.target, "namespace", node.target))


def first_collective(gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The graph's first call of a c10d collective, or None."""
    return next((node for node in gm.graph.nodes if is_collective(node)), None)


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of Dynamo's graph to rewrite for the host, with what AOTAutograd reads from Dynamo
    (the graph's meta, its parameters' and each input's source). Each node's meta dict is a
    shallow copy: the rewrite replaces its values, never mutates them."""
    graph = torch.fx.Graph()
    copied: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, copied))
    copy = torch.fx.GraphModule(gm, graph)
    copy.meta.update(gm.meta)
    if hasattr(gm, "_param_name_to_source"):
        copy._param_name_to_source = gm._param_name_to_source
    for node, new in copied.items():
        if hasattr(node, "_dynamo_source"):
            new._dynamo_source = node._dynamo_source
    return copy


def rewrite_to_cpu(gm: torch.fx.GraphModule, fake_mode) -> None:
    """Make ``gm`` a CPU graph: device arguments and each node's fake value move to CPU."""
    for node in gm.graph.nodes:
        node.args = _to_cpu_device(node.args)
        node.kwargs = _to_cpu_device(node.kwargs)
        for name in ("val", "example_value"):  # AOTAutograd's and Dynamo's names
            if name in node.meta:
                node.meta[name] = torch.utils._pytree.tree_map(lambda v: _cpu_fake(v, fake_mode, True),
                                                               node.meta[name])
    gm.recompile()


def _attribute_owner(gm: torch.nn.Module, target: str) -> tuple[torch.nn.Module, str]:
    *path, name = target.split(".")
    owner = gm
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def lift_tensor_attributes(gm: torch.fx.GraphModule, fake_mode, original: torch.nn.Module) -> list[torch.Tensor]:
    """Turn the graph's tensor attributes into its leading inputs; returns those tensors in order.

    Dynamo installs what it treats as static state as attributes of the graph module: an
    optimizer's parameters and state, a module's parameters and buffers when it is not inlined,
    constant tensors. They are real neuron tensors, which neither the CPU fakes nor the CPU
    code can use. As inputs they are passed like any other: a fresh CPU alias of the same bytes
    on every call, so in-place updates (optimizer state, running statistics) land in the neuron
    tensors, their version counters move, and a later ``.data`` swap is seen. The values are
    then no part of the compiled code, so the cache key (graph and input metadata) stays right.
    ``gm`` is a copy of ``original``; an attribute is taken off the copy only, never off a module
    the two share (a called submodule), which belongs to the user.
    """
    shared = {id(m) for m in original.modules()}
    nodes = [n for n in gm.graph.nodes if n.op == "get_attr"
             and isinstance(getattr(*_attribute_owner(gm, n.target)), torch.Tensor)]
    if not nodes:
        return []
    sources = getattr(gm, "_param_name_to_source", None) or {}
    first_input = next((n for n in gm.graph.nodes if n.op == "placeholder"), None)
    first_node = first_input if first_input is not None else next(iter(gm.graph.nodes))
    lifted: list[torch.Tensor] = []
    placeholders: dict[str, torch.fx.Node] = {}
    for node in nodes:
        if node.target not in placeholders:
            placeholders[node.target], value = _lifted_input(gm, node, shared, first_node, fake_mode,
                                                             sources.get(node.target))
            lifted.append(value)
        node.replace_all_uses_with(placeholders[node.target])
        gm.graph.erase_node(node)
    gm.recompile()
    return lifted


def _lifted_input(gm: torch.fx.GraphModule, node: torch.fx.Node, shared: set[int], first_node: torch.fx.Node,
                  fake_mode, source) -> tuple[torch.fx.Node, torch.Tensor]:
    """A new leading input standing for the attribute ``node`` reads, which leaves the copy ``gm``;
    (the input, the attribute's tensor)."""
    owner, name = _attribute_owner(gm, node.target)
    if owner is not gm and id(owner) in shared:
        raise NotImplementedError(
            f"the graph reads tensor {node.target!r} from inside a submodule it also calls; neuron "
            "cannot lift it to an input without changing your module")
    value = getattr(owner, name)
    with gm.graph.inserting_before(first_node):
        placeholder = gm.graph.placeholder(f"lifted_{node.target.replace('.', '_')}")
    placeholder.meta.update(node.meta)
    if not isinstance(placeholder.meta.get("example_value"), torch.Tensor):
        placeholder.meta["example_value"] = fake_mode.from_tensor(value, static_shapes=True)
    placeholder._dynamo_source = source  # AOTAutograd reads it off every input
    delattr(owner, name)
    return placeholder, value


def cpu_example_inputs(example_inputs: Sequence[Any], fake_mode) -> list:
    """CPU fakes of the inputs. Inputs that share a neuron storage (a tensor and its view, a
    lifted attribute and an argument) share one CPU fake storage, without a ``_base``, exactly as
    their CPU aliases do at run time: AOTAutograd compiles for the aliasing it will meet."""
    from torch.multiprocessing.reductions import StorageWeakRef

    def storage_of(v):
        if isinstance(v, torch.Tensor) and v.device.type == BACKEND_NAME:
            return StorageWeakRef(v.untyped_storage())
        return None

    keys = [storage_of(v) for v in example_inputs]
    counts = collections.Counter(k for k in keys if k is not None)
    shared = {k for k, n in counts.items() if n > 1}
    bases: dict[Any, torch.Tensor] = {}
    result = []
    for v, key in zip(example_inputs, keys):
        if key is None or key not in shared:
            result.append(_cpu_fake(v, fake_mode, keep_grad=True))
            continue
        if key not in bases:
            with fake_mode:
                bases[key] = torch.empty(v.untyped_storage().nbytes(), dtype=torch.uint8, device=_CPU)
        with fake_mode:
            cpu = torch.empty(0, dtype=v.dtype, device=_CPU).set_(
                bases[key].untyped_storage(), v.storage_offset(), v.shape, v.stride())
        if v.requires_grad:
            cpu.requires_grad_(True)
        result.append(cpu)
    return result


@dataclasses.dataclass
class HostGraph:
    """Dynamo's graph made a CPU graph: what either executor compiles."""
    gm: torch.fx.GraphModule
    inputs: list  # CPU fakes: the lifted tensor attributes first, then Dynamo's inputs
    lifted: list[torch.Tensor]  # the real lifted tensors, passed before the caller's arguments on every call
    backend_id: str | None  # Dynamo's id of the graph (the packages of caching precompile name it)


def for_host(gm: torch.fx.GraphModule, example_inputs) -> HostGraph:
    """A copy of ``gm`` rewritten to CPU (Dynamo still reads ``gm``'s inputs after the backend
    returns), its tensor attributes lifted to leading inputs, and CPU fakes of every input."""
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode(example_inputs)
    host_gm = copy_graph_module(gm)
    lifted = lift_tensor_attributes(host_gm, fake_mode, gm)
    rewrite_to_cpu(host_gm, fake_mode)
    lifted_fakes = [n.meta["example_value"] for n in host_gm.graph.find_nodes(op="placeholder")][:len(lifted)]
    return HostGraph(host_gm, cpu_example_inputs([*lifted_fakes, *example_inputs], fake_mode), lifted,
                     getattr(gm, "_backend_id", None))
