"""Runs Dynamo graphs of neuron tensors as host code: Inductor for CPU, on the same bytes.

The graph is rewritten to CPU (device literals and every value's metadata) and compiled by
Inductor exactly as a CPU graph is, so Inductor's caches (FX graph, AOTAutograd) apply. At run
time neuron inputs are passed as CPU aliases of the same bytes and the outputs come back as
neuron tensors without a copy (``_enter/_exit_compiled_call`` in csrc/compiled_calls.cpp). When
gradients flow, an autograd.Function bridges neuron autograd to the CPU graph's: its backward
runs the compiled backward on CPU aliases of the incoming gradients. Tensors Dynamo installs as
graph attributes (optimizer state, parameters, buffers, free tensors) are lifted to inputs, so
they take the same path.
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Sequence

import torch
import torch.fx

NEURON = "neuron"
_CPU = torch.device("cpu")


def _is_neuron_device_string(value: Any) -> bool:
    return isinstance(value, str) and (value == NEURON or value.startswith(NEURON + ":"))


def _to_cpu_device(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == NEURON or _is_neuron_device_string(value):
        return _CPU
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu_device(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu_device(v) for k, v in value.items()}
    return value


def _cpu_fake(value: Any, fake_mode, keep_grad: bool = False) -> Any:
    """A CPU fake with the metadata of a neuron (fake) tensor; anything else unchanged."""
    if not isinstance(value, torch.Tensor) or value.device.type != NEURON:
        return value
    with fake_mode:
        cpu = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=_CPU)
        if value.storage_offset():
            cpu = cpu.as_strided(value.shape, value.stride(), value.storage_offset())
    if keep_grad and value.requires_grad:
        cpu.requires_grad_(True)
    return cpu


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
            placeholder._dynamo_source = sources.get(node.target)  # AOTAutograd reads it off every input
            placeholders[node.target] = placeholder
            lifted.append(value)
            delattr(owner, name)
        node.replace_all_uses_with(placeholders[node.target])
        gm.graph.erase_node(node)
    gm.recompile()
    return lifted


def _ops():
    ops = torch.ops.neuron
    return ops._enter_compiled_call, ops._exit_compiled_call, ops._abort_compiled_call


class NEFFExecutionError(RuntimeError):
    """A compiled graph failed while running (TorchNeuron's name; the cause is chained)."""


def _call(compiled: Callable, cpu_args: Sequence[Any]) -> Any:
    """Run the compiled graph on CPU aliases; on failure pop the alias frame and say which part failed."""
    try:
        return compiled(*cpu_args)
    except Exception as error:
        _ops()[2]()
        raise NEFFExecutionError(f"a neuron compiled graph failed while running: {type(error).__name__}: "
                                 f"{error}") from error
    except BaseException:
        _ops()[2]()
        raise


def _run(compiled: Callable, args: Sequence[Any], positions: list[int], aliases: list) -> tuple[list, Any]:
    """Call ``compiled`` with ``aliases`` in place of the tensor arguments; returns (flat
    outputs, their tree spec)."""
    cpu_args = list(args)
    for i, alias in zip(positions, aliases):
        cpu_args[i] = alias
    return torch.utils._pytree.tree_flatten(_call(compiled, cpu_args))


def _map_back(flat: list, slots: list[int], mapped: Sequence[torch.Tensor], spec) -> Any:
    flat = list(flat)
    for i, t in zip(slots, mapped):
        flat[i] = t
    return torch.utils._pytree.tree_unflatten(flat, spec)


class _GradBridge(torch.autograd.Function):
    """Neuron autograd around a CPU-compiled graph: forward runs it on CPU aliases with grad
    enabled; backward differentiates the CPU outputs and adopts the input gradients."""

    @staticmethod
    def forward(ctx, compiled, args, positions, holder, *tensors):
        enter, leave, _ = _ops()
        aliases = enter(list(tensors))
        for t, alias in zip(tensors, aliases):
            if t.requires_grad:
                alias.requires_grad_(True)
        with torch.enable_grad():
            flat, spec = _run(compiled, args, positions, aliases)
        slots = [i for i, o in enumerate(flat) if isinstance(o, torch.Tensor)]
        cpu_outputs = [flat[i] for i in slots]
        mapped = leave(cpu_outputs)
        ctx.cpu_inputs = [a for t, a in zip(tensors, aliases) if t.requires_grad]
        ctx.needs = [t.requires_grad for t in tensors]
        ctx.cpu_outputs = cpu_outputs
        ctx.device = next((t.device for t in tensors if t.device.type == NEURON), None)
        ctx.mark_non_differentiable(*[m for m, o in zip(mapped, cpu_outputs) if not o.requires_grad])
        holder.extend([flat, slots, spec])
        return tuple(mapped)

    @staticmethod
    @torch._disable_dynamo  # called by autograd from user code Dynamo may be tracing (loss.backward() in a compiled step)
    def backward(ctx, *grads):
        enter, leave, _ = _ops()
        pairs = [(o, g) for o, g in zip(ctx.cpu_outputs, grads) if o.requires_grad and g is not None]
        grad_aliases = enter([g for _, g in pairs])
        leave([])
        cpu_grads = torch.autograd.grad([o for o, _ in pairs], ctx.cpu_inputs, grad_aliases, allow_unused=True)
        with torch.neuron.device(ctx.device):
            enter([])
            present = [g for g in cpu_grads if g is not None]
            adopted = iter(leave(present))
        by_input = iter(None if g is None else next(adopted) for g in cpu_grads)
        return (None, None, None, None, *[next(by_input) if need else None for need in ctx.needs])


def run_graph_on_neuron(compiled: Callable, leading: Sequence[torch.Tensor] = ()) -> Callable:
    """Wrap a CPU-compiled graph so it takes and returns neuron tensors, zero-copy; ``leading``
    (the lifted tensor attributes) go before the caller's arguments on every call."""
    leading = tuple(leading)

    def call(*args):
        if leading:
            args = (*leading, *args)
        positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        tensors = [args[i] for i in positions]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            holder: list = []
            mapped = _GradBridge.apply(compiled, args, positions, holder, *tensors)
            flat, slots, spec = holder
            return _map_back(flat, slots, mapped, spec)
        if len(positions) == len(args):  # the usual graph: tensors in, a list/tuple of tensors out
            outputs = _call(compiled, enter(tensors))
            if type(outputs) in (list, tuple) and all(isinstance(o, torch.Tensor) for o in outputs):
                return type(outputs)(leave(list(outputs)))
            flat, spec = torch.utils._pytree.tree_flatten(outputs)
        else:
            flat, spec = _run(compiled, args, positions, enter(tensors))
        slots = [i for i, o in enumerate(flat) if isinstance(o, torch.Tensor)]
        return _map_back(flat, slots, leave([flat[i] for i in slots]), spec)

    enter, leave, _ = _ops()
    return call


def cpu_example_inputs(example_inputs: Sequence[Any], fake_mode) -> list:
    """CPU fakes of the inputs. Inputs that share a neuron storage (a tensor and its view, a
    lifted attribute and an argument) share one CPU fake storage, without a ``_base``, exactly as
    their CPU aliases do at run time: AOTAutograd compiles for the aliasing it will meet."""
    from torch.multiprocessing.reductions import StorageWeakRef

    def storage_of(v):
        if isinstance(v, torch.Tensor) and v.device.type == NEURON:
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
