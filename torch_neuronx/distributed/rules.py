"""TorchNeuron's rules for the collectives of its process group, and its words when it refuses one.

TorchNeuron's ``ProcessGroupNeuron`` (its ``torch_neuronx/distributed/backend.py``) runs each collective
as an XLA collective whose ``can_handle`` checks the call first (its ``python_ops/xla_ops/*_xla.py``).
What those checks accept and refuse is what a program meets on Trainium, so the ``neuron`` group here
applies the same checks, in the same order, before Gloo sees the call:

- tensors on neuron only (a CPU tensor raises ``Expected neuron device, got cpu``);
- no empty tensors (all_reduce, reduce_scatter, all_to_all), nor a zero first dimension (the gathers);
  the coalesced forms skip empty tensors instead;
- reduce ops SUM, AVG (integer AVG truncates, as CUDA's), MIN and MAX; PREMUL_SUM where TorchNeuron
  scales the inputs first (all_reduce, reduce_scatter and their tensor forms); PRODUCT and the bitwise
  ops are refused;
- all_to_all on 4, 8 or 16 ranks (or a multiple of 32) whose group starts at a multiple of its size,
  and all_to_all_single with even splits only;
- a root rank inside the group.

Each refusal keeps TorchNeuron's words (its exception type, its ``Operation ... is not implemented
for Neuron`` prefix for a check its collective fails) and adds the fix after them.
"""
from __future__ import annotations

import torch

from torch_neuronx.runtime import BACKEND_NAME, ops

SUPPORTED_OPS = ("SUM", "AVG", "MIN", "MAX")
ALL_TO_ALL_SIZES = (4, 8, 16)  # or a multiple of 32: the world sizes Trainium's AllToAll (mesh) supports

CPU_FIX = ("TorchNeuron's process group (backend 'neuron') takes neuron tensors only: move them with "
           ".to('neuron') first, or give CPU tensors a group of their own: dist.new_group(backend='gloo').")
EMPTY_FIX = ("TorchNeuron's collectives refuse empty tensors: skip the call for them "
             "(if t.numel(): dist...).")
OP_FIX = ("Use SUM, AVG, MIN or MAX; for a product, all_gather the values and multiply them "
          "(torch.stack(gathered).prod(0)).")
DTYPE_FIX = "Give every tensor of the call the same dtype."
SPLIT_FIX = ("Pad every rank's chunk to the same size and pass no split sizes (or all ones); "
             "all_to_all (lists) takes equal shapes too.")
ROOT_FIX = "Pass a rank of the group: 0 to {top}."


def refuse(op: str, reason: str, fix: str) -> NotImplementedError:
    """TorchNeuron's error when no implementation of its collective takes the call."""
    return NotImplementedError(f"Operation {op} is not implemented for Neuron. Details: {reason}. {fix}")


def flat(tensors) -> list[torch.Tensor]:
    """Tensors of a tensor, a list or a list of lists, in order."""
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    return [t for x in tensors for t in flat(x)]


def _inside_compiled_backward() -> bool:
    """Whether autograd is running a compiled graph's backward (AOTAutograd's node), which runs on host
    tensors here, as the forward does."""
    node = torch._C._current_autograd_node()
    return node is not None and type(node).__name__ == "CompiledFunctionBackward"


def on_neuron(tensors) -> None:
    """TorchNeuron's group finds its stream from the call's first tensor: any other device is refused.
    Not inside a compiled graph: TorchNeuron lowers its collectives into the graph (they never reach
    the group's methods), and here the graph runs on host aliases of the neuron tensors."""
    if ops._inside_compiled_call() or _inside_compiled_backward():
        return
    for t in flat(tensors):
        if t.device.type != BACKEND_NAME:
            raise ValueError(f"Expected neuron device, got {t.device.type}. {CPU_FIX}")


def reduce_type(op: str, opts, premul: bool = False) -> str:
    """The reduce op's name (SUM, AVG, MIN, MAX; PREMUL_SUM where the collective scales first)."""
    name = opts.reduceOp.op.name
    if name in SUPPORTED_OPS or (premul and name == "PREMUL_SUM"):
        return name
    raise refuse(op, f"unsupported reduce operation '{name}', supported ops: {list(SUPPORTED_OPS)}", OP_FIX)


def premul_factor(opts):
    """PREMUL_SUM's factor (a number or a tensor)."""
    return opts.reduceOp.__getstate__()[1]


def not_empty(op: str, tensors, what: str = "tensors") -> None:
    empty = [i for i, t in enumerate(tensors) if t.numel() == 0]
    if empty:
        raise refuse(op, f"{what} cannot be empty, found empty tensors at indices: {empty}", EMPTY_FIX)


def no_zero_dim0(tensors, op: str | None = None) -> None:
    """The gathers' check: no tensor with a zero first dimension (ValueError from the group itself,
    NotImplementedError from the collective when ``op`` names it)."""
    empty = [(i, t.shape) for i, t in enumerate(tensors) if t.dim() and t.size(0) == 0]
    if empty:
        reason = "tensors cannot have zero size in dimension 0, found: " + ", ".join(
            f"tensor[{i}]: {shape}" for i, shape in empty)
        raise ValueError(f"{reason}. {EMPTY_FIX}") if op is None else refuse(op, reason, EMPTY_FIX)


def same_dtype(op: str, tensors, what: str = "all tensors") -> None:
    first = tensors[0].dtype
    other = [(i, t.dtype) for i, t in enumerate(tensors) if t.dtype != first]
    if other:
        found = ", ".join(f"tensor[{i}]: {dtype}" for i, dtype in other)
        raise refuse(op, f"{what} must have same dtype, expected {first} but found: {found}", DTYPE_FIX)


def root(rank: int, size: int) -> None:
    """TorchNeuron's root check (its words say broadcast for every rooted collective)."""
    if rank < 0 or rank >= size:
        raise ValueError(f"Invalid rootRank {rank} for broadcast with world size {size}. "
                         + ROOT_FIX.format(top=size - 1))


def gathered_shape(input: torch.Tensor, size: int) -> tuple[int, ...]:
    """The output shape all_gather_into_tensor takes: the input's, its first dimension times the group."""
    return (size * input.shape[0], *input.shape[1:]) if input.dim() else (size,)


def gathered(inputs, outputs) -> None:
    """The checks TorchNeuron's all_gather collective makes first, in its order: the device (outputs
    first), no zero first dimension, one dtype."""
    on_neuron([*outputs, *inputs])
    no_zero_dim0([*inputs, *outputs], "all_gather")
    same_dtype("all_gather", [*inputs, *outputs])


def sliced_outputs(op: str, input: torch.Tensor, outputs) -> None:
    """all_gather and gather: each output has the input's shape."""
    wrong = [(i, o.shape) for i, o in enumerate(outputs) if o.shape != input.shape]
    if wrong:
        found = ", ".join(f"output[{i}]: {shape}" for i, shape in wrong)
        raise refuse(op, f"with slice_output=True, all output tensors must match input shape {input.shape}, "
                         f"found: {found}", "Give each output the input's shape.")


def all_to_all_groups(groups: list[list[int]]) -> None:
    """Trainium's AllToAll (mesh) runs on 4, 8, 16 or a multiple of 32 ranks, in groups that start at
    a multiple of their size: the group's ranks, and the other ranks in groups alike (TorchNeuron's
    AllToAllXlaOp and create_global_replica_group)."""
    size = len(groups[0])
    if size not in ALL_TO_ALL_SIZES and size % 32:
        raise refuse("all_to_all", f"unsupported world size {size}, supported sizes: 4, 8, 16, or multiples of 32",
                     "Run all_to_all on a group of 4, 8 or 16 ranks (or a multiple of 32).")
    wrong = [(i, g) for i, g in enumerate(groups) if g[0] % size]
    if wrong:
        found = ", ".join(f"group[{i}] {g} starts at rank {g[0]}" for i, g in wrong)
        raise refuse("all_to_all", f"replica group start ranks must be multiples of world size ({size}), found: "
                                   f"{found}", f"Make the group's ranks consecutive from a multiple of {size}.")


def all_to_all_inputs(inputs, size: int) -> None:
    if len(inputs) != size:
        raise refuse("all_to_all", f"number of input tensors ({len(inputs)}) must equal world size ({size})",
                     "Pass one input tensor per rank of the group.")
    not_empty("all_to_all", inputs, "input tensors")
    same_dtype("all_to_all", inputs, "all input tensors")
    same_shapes("all_to_all", inputs, "all input tensors")


def even_splits(splits, name: str, size: int) -> None:
    """all_to_all_single: no split sizes, or all ones (TorchNeuron's alltoall_base)."""
    if splits is None or len(splits) == 0 or all(s == 1 for s in splits):
        return
    if len(splits) != size:
        raise NotImplementedError(f"alltoall_base: {name}_split_sizes length ({len(splits)}) must match "
                                  f"group_size ({size}). {SPLIT_FIX}")
    raise NotImplementedError(f"alltoall_base: Only even split sizes are supported. Got {name}_split_sizes: "
                              f"{list(splits)}. {SPLIT_FIX}")


def same_shapes(op: str, tensors, what: str = "all tensors") -> None:
    first = tensors[0].shape
    other = [(i, t.shape) for i, t in enumerate(tensors) if t.shape != first]
    if other:
        found = ", ".join(f"tensor[{i}]: {shape}" for i, shape in other)
        raise refuse(op, f"{what} must have same shape, expected {first} but found: {found}",
                     "Give every tensor of the list the same shape.")


def reduce_scatter_output(output: torch.Tensor, input: torch.Tensor) -> None:
    if output.numel() == 0:
        raise refuse("reduce_scatter", "output tensor cannot be empty", EMPTY_FIX)
    if output.dtype != input.dtype:
        raise refuse("reduce_scatter", f"output tensor dtype ({output.dtype}) must match input tensor dtype "
                                       f"({input.dtype})", DTYPE_FIX)


def scatter_dim(input_shape, output_shape, size: int) -> tuple[int, list[int], list[int]]:
    """A one-tensor reduce_scatter splits the input along the one dimension where it differs from the
    output (the shorter shape padded with leading ones), by the group's size: (that dimension, the padded
    input shape, the padded output shape)."""
    inp, out = list(input_shape), list(output_shape)
    inp, out = [1] * (len(out) - len(inp)) + inp, [1] * (len(inp) - len(out)) + out
    diff = [i for i, (a, b) in enumerate(zip(inp, out)) if a != b]
    fix = "Give the output the input's shape with one dimension divided by the group's size."
    if len(diff) > 1:
        found = ", ".join(f"dim[{i}]: {inp[i]} -> {out[i]}" for i in diff)
        raise refuse("reduce_scatter", f"single tensor scatter can only differ in one dimension, found "
                                       f"differences in: {found}", fix)
    if not diff:
        if size != 1:
            raise refuse("reduce_scatter", f"when input and output shapes are identical, replica group must "
                                           f"have size 1, got {size}", fix)
        return 0, inp, out
    d = diff[0]
    if inp[d] / out[d] != size:
        raise refuse("reduce_scatter", f"scatter dimension {d}: input size ({inp[d]}) must be evenly divisible by "
                                       f"replica group size ({size}), but {inp[d]} / {size} = {inp[d] / size}. "
                                       f"Expected output size: {inp[d] // size}, actual output size: {out[d]}", fix)
    return d, inp, out


def one_input_per_rank(output: torch.Tensor, inputs, size: int) -> None:
    """reduce_scatter (and scatter) with an input list: one tensor per rank, each of the output's shape."""
    if len(inputs) != size:
        raise refuse("reduce_scatter", f"multi-tensor scatter: replica group size ({size}) must equal number of "
                                       f"input tensors ({len(inputs)})", "Pass one input tensor per rank of the group.")
    if output.shape != inputs[0].shape:
        raise refuse("reduce_scatter", f"output tensor shape {output.shape} must match the input tensors' shape "
                                       f"{inputs[0].shape}", "Give the output the shape of each input.")


def same_trailing_shape(inputs) -> None:
    """reduce_scatter_tensor_coalesced: every input has the same shape after its first dimension."""
    if any(t.shape[1:] != inputs[0].shape[1:] for t in inputs):
        raise ValueError("reduce_scatter_tensor_coalesced requires all input tensors to have the same shape "
                         f"except dimension 0. Got shapes: {[t.shape for t in inputs]}. Coalesce only tensors whose "
                         "shapes differ in the first dimension.")


GATHER_FIX = "Give the output the input's shape with its first dimension times the group's size."


def gathered_output(output: torch.Tensor, input: torch.Tensor, size: int) -> None:
    expected = gathered_shape(input, size)
    if tuple(output.shape) != expected:
        raise refuse("all_gather", f"output shape mismatch, expected {expected}, got {output.shape}", GATHER_FIX)


def gathered_pairs(outputs, inputs, size: int) -> None:
    """all_gather_into_tensor_coalesced: each output is its input gathered."""
    if len(inputs) == 1:
        return gathered_output(outputs[0], inputs[0], size)
    wrong = [f"pair[{i}]: expected {gathered_shape(t, size)}, got {o.shape}"
             for i, (o, t) in enumerate(zip(outputs, inputs)) if tuple(o.shape) != gathered_shape(t, size)]
    if wrong:
        raise refuse("all_gather", f"output shape mismatches: {'; '.join(wrong)}", GATHER_FIX)


def gathered_per_tensor(inputs, outputs, size: int) -> None:
    """all_gather_coalesced: the outputs, per tensor then per rank, each of its tensor's shape."""
    if len(outputs) != len(inputs) * size:
        raise refuse("all_gather", f"with slice_output=True and {len(inputs)} input tensors, expected "
                                   f"{len(inputs) * size} output tensors, got {len(outputs)}",
                     "Pass one list per input tensor, each with one output per rank ([tensor][rank]).")
    for i, input in enumerate(inputs):
        for j in range(size):
            out = outputs[i * size + j]
            if out.shape != input.shape:
                raise refuse("all_gather", f"output tensor at index {i * size + j} has shape {out.shape}, "
                                           f"expected {input.shape} to match input tensor {i}",
                             "Output lists go per input tensor, then per rank ([tensor][rank]).")
