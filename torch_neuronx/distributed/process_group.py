"""The ``neuron`` process group: TorchNeuron's ``ProcessGroupNeuron``, its collectives run by Gloo.

TorchNeuron's group (its ``torch_neuronx/distributed/backend.py``) is a Python ``ProcessGroup`` whose
collectives are XLA collectives on the NeuronCores. This one keeps its rules (``rules.py``: what it
takes, what it refuses and in which words, and what each call means) and runs each call on Gloo, over
the neuron tensors' own bytes:

- ``reduce_scatter`` with a one-tensor input list splits that tensor by the group (along the one
  dimension where it differs from the output, as ``reduce_scatter_tensor`` does); with several, one
  per rank;
- ``reduce`` leaves the tensors of the ranks other than the root unchanged;
- ``all_gather_into_tensor`` takes an output whose shape, with size-1 dimensions squeezed when the
  ranks differ, is the input's with the first dimension times the group; ``all_gather_coalesced``
  lists its outputs per tensor, then per rank (``[tensor][rank]``);
- AVG is a SUM then a division (integers truncate), PREMUL_SUM scales the inputs, then sums;
- the coalesced forms skip empty tensors; ``barrier`` runs on the default group only.

Each call is then described as Gloo will run it and compared across the ranks
(``collective_checks.py``), unless ``TORCH_NEURONX_COLLECTIVE_CHECKS=0``, and run on the group's
*stock group*: a plain C++ ``ProcessGroup`` over the same Gloo, never this class's own C++ base.
Why: torch's trampoline runs a Python group's C++ base method holding the GIL (``WORK_OVERRIDE`` in
PyProcessGroup.hpp), so ``super().allreduce`` would enqueue into Gloo holding it, and Gloo's worker,
which drops a finished Work (and with it tensors that have Python objects, which takes the GIL)
while holding the lock enqueuing takes, would deadlock with it. The stock group has no trampoline
and torch binds its methods with the GIL released. A call whose result needs a step after Gloo's
(an average, a copy into the caller's layout) waits for Gloo, takes the step, and returns a
completed Work. Point-to-point calls are not compared (there is no common call), but take the
same route.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from torch_neuronx.distributed import rules
from torch_neuronx.distributed.collective_checks import CollectiveCheck, tensor_text, tensors_text
from torch_neuronx.runtime import BACKEND_NAME

PG = dist.ProcessGroup


def _done(outputs) -> dist.Work:
    """A completed Work whose result is ``outputs`` (as Gloo's is)."""
    future = torch.futures.Future()
    future.set_result(list(outputs))
    return _create_work_from_future(future)


def _gloo_options(options, opts, op: str):
    """``options`` (a new options object for the Gloo call) with the caller's timeout and Gloo's op:
    AVG and PREMUL_SUM are SUMs there (the division or the scaling is ours)."""
    options.reduceOp = dist.ReduceOp.SUM if op in ("AVG", "PREMUL_SUM") else getattr(dist.ReduceOp, op)
    options.timeout = opts.timeout
    return options


def _average(tensors, size: int) -> None:
    """TorchNeuron's AVG: the sum divided by the group's size, in the tensor's dtype (integers truncate)."""
    with torch.no_grad():
        for t in tensors:
            if t.is_floating_point() or t.is_complex():
                t.div_(size)
            else:
                t.copy_(torch.div(t, size, rounding_mode="trunc"))


def _scaled(tensors, opts):
    """PREMUL_SUM's inputs: each times the factor (new tensors; the caller's stay as they were)."""
    factor = rules.premul_factor(opts)
    with torch.no_grad():
        return [t * factor for t in tensors]


def _global_groups(ranks: list[int], world: int) -> list[list[int]]:
    """TorchNeuron's replica groups for all_to_all: the group's ranks, then the others in consecutive
    groups of the same size (its create_global_replica_group)."""
    size = len(ranks)
    unused = [r for r in range(world) if r not in ranks]
    return [ranks] + [unused[j:j + size] for j in range(0, world - size, size)]


class ProcessGroupNeuron(PG):
    """TorchNeuron's process group for neuron tensors, each collective run by Gloo."""

    def __init__(self, backend, store, rank: int, size: int, timeout, checks: bool):
        super().__init__(rank, size)
        # Collectives run on this plain group: torch releases the GIL in its methods (see above).
        self._stock = PG(rank, size)
        for group in (self, self._stock):
            for device in ("cpu", BACKEND_NAME):  # the c10d kernels of neuron tensors run CPU's, on aliases
                group._register_backend(torch.device(device), PG.BackendType.CUSTOM, backend)
            group._set_default_backend(PG.BackendType.CUSTOM)
        self._checks = CollectiveCheck(store, rank, size, timeout) if checks and size > 1 else None

    def getBackendName(self):
        return BACKEND_NAME

    def name(self):
        return BACKEND_NAME

    @property
    def _device_types(self):
        # TorchNeuron's group serves neuron only: object collectives and barrier use neuron tensors.
        return [torch.device(BACKEND_NAME)]

    def _check(self, call: str) -> None:
        if self._checks is not None:
            self._checks(call, self.group_name)

    # -- all_reduce, broadcast, reduce

    def allreduce(self, tensors, opts=None, timeout=None):
        if not isinstance(opts, dist.AllreduceOptions):  # torch's other forms: (tensor(s)[, op[, timeout]])
            op, opts = opts, dist.AllreduceOptions()
            if op is not None:
                opts.reduceOp = op
            if timeout is not None:
                opts.timeout = timeout
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        rules.on_neuron(tensors)
        op = rules.reduce_type("all_reduce", opts, premul=True)
        rules.not_empty("all_reduce", tensors)
        rules.same_dtype("all_reduce", tensors)
        if op == "PREMUL_SUM":  # in place: all_reduce overwrites them anyway
            for t, scaled in zip(tensors, _scaled(tensors, opts)):
                t.copy_(scaled)
        self._check(f"all_reduce({tensors_text(tensors)}, {op})")
        work = self._stock.allreduce(tensors, _gloo_options(dist.AllreduceOptions(), opts, op))
        return self._averaged(work, tensors) if op == "AVG" else work

    def _averaged(self, work, tensors):
        work.wait()
        _average(tensors, self.size())
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        rules.on_neuron(tensors)
        full = [t for t in tensors if t.numel()]  # TorchNeuron skips empty tensors here
        if not full:
            return _done(tensors)
        op = rules.reduce_type("all_reduce", opts)
        rules.same_dtype("all_reduce", full)
        self._check(f"all_reduce_coalesced({tensors_text(full)}, {op})")
        work = self._stock.allreduce_coalesced(full, _gloo_options(dist.AllreduceCoalescedOptions(), opts, op))
        return self._averaged(work, full) if op == "AVG" else work

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        rules.on_neuron(tensors)
        if tensors[0].numel() == 0:
            return _done(tensors)
        rules.root(opts.rootRank, self.size())
        self._check(f"broadcast({tensors_text(tensors)}, src={opts.rootRank})")
        return self._stock.broadcast(tensors, opts)

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        rules.root(opts.rootRank, self.size())
        rules.on_neuron(tensors)
        op = rules.reduce_type("all_reduce", opts)
        rules.not_empty("all_reduce", tensors)
        rules.same_dtype("all_reduce", tensors)
        # TorchNeuron all_reduces; only the root's tensors take the result.
        targets = list(tensors) if self.rank() == opts.rootRank else [t.clone() for t in tensors]
        self._check(f"reduce({tensors_text(tensors)}, {op}, dst={opts.rootRank})")
        work = self._stock.allreduce(targets, _gloo_options(dist.AllreduceOptions(), opts, op))
        return self._averaged(work, targets) if op == "AVG" else work

    # -- gathers

    def allgather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        outputs = rules.flat(output_lists)
        rules.no_zero_dim0([*inputs, *outputs])
        rules.on_neuron([*outputs, *inputs])
        rules.same_dtype("all_gather", [*inputs, *outputs])
        rules.sliced_outputs("all_gather", inputs[0], outputs)
        self._check(f"all_gather({tensors_text(inputs)})")
        return self._stock.allgather(output_lists, inputs, opts)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        outputs, size = rules.flat(output_lists), self.size()  # TorchNeuron's order: [tensor][rank]
        rules.gathered(inputs, outputs)
        if len(inputs) == 1:
            rules.sliced_outputs("all_gather", inputs[0], outputs)
        else:
            rules.gathered_per_tensor(inputs, outputs, size)
        per_rank = [[outputs[i * size + r] for i in range(len(inputs))] for r in range(size)]
        self._check(f"all_gather_coalesced({tensors_text(inputs)})")
        return self._stock.allgather_coalesced(per_rank, inputs, opts)

    def _gathered_into(self, output, input):
        """all_gather_into_tensor's output and input as Gloo takes them, after TorchNeuron's checks."""
        if output.dim() != input.dim():  # TorchNeuron squeezes both when the ranks differ
            output, input = output.squeeze(), input.squeeze()
        rules.gathered([input], [output])
        rules.gathered_output(output, input, self.size())
        self._check(f"all_gather_into_tensor({tensor_text(output)}, {tensor_text(input)})")
        return output, input

    def all_gather_single(self, output, input, opts=None):
        output, input = self._gathered_into(output, input)
        return self._stock.all_gather_single(output, input, opts if opts is not None else dist.AllgatherOptions())

    def _allgather_base(self, output, input, opts=None):
        output, input = self._gathered_into(output, input)
        return self._stock._allgather_base(output, input, opts if opts is not None else dist.AllgatherOptions())

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        keep = [i for i, t in enumerate(inputs) if t.numel()]  # TorchNeuron skips empty inputs here
        if not keep:
            return _done(outputs)
        ins, outs = [inputs[i] for i in keep], [outputs[i] for i in keep]
        rules.no_zero_dim0([*ins, *outs])
        rules.on_neuron([*outs, *ins])
        rules.same_dtype("all_gather", [*ins, *outs])
        rules.gathered_pairs(outs, ins, self.size())
        self._check(f"all_gather_into_tensor_coalesced({tensors_text(outs)}, {tensors_text(ins)})")
        return self._stock.all_gather_single_coalesced(outs, ins, opts if opts is not None else dist.AllgatherOptions())

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        rules.root(opts.rootRank, self.size())
        outputs = rules.flat(output_lists)
        rules.gathered(inputs, outputs)
        rules.sliced_outputs("all_gather", inputs[0], outputs)
        self._check(f"gather({tensors_text(inputs)}, dst={opts.rootRank})")
        return self._stock.gather(output_lists, inputs, opts)

    # -- reduce-scatters and scatter

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        inputs = list(input_lists[0])
        rules.on_neuron([*outputs, *inputs])
        op = self._scatter_checks(outputs[0], inputs, opts)
        if op == "PREMUL_SUM":
            inputs = _scaled(inputs, opts)
        if len(inputs) == 1:  # one tensor: split by the group, as reduce_scatter_tensor does
            return self._scatter_one(outputs[0], inputs[0], op, opts)
        rules.one_input_per_rank(outputs[0], inputs, self.size())
        self._check(f"reduce_scatter({tensors_text(outputs)}, {tensors_text(inputs)}, {op})")
        work = self._stock.reduce_scatter(outputs, [inputs], _gloo_options(dist.ReduceScatterOptions(), opts, op))
        return self._averaged(work, outputs) if op == "AVG" else work

    @staticmethod
    def _scatter_checks(output, inputs, opts) -> str:
        """TorchNeuron's ReduceScatterXLAOp checks, in its order; the reduce op's name."""
        op = rules.reduce_type("reduce_scatter", opts, premul=True)
        rules.not_empty("reduce_scatter", inputs)
        rules.same_dtype("reduce_scatter", inputs)
        rules.same_shapes("reduce_scatter", inputs)
        rules.reduce_scatter_output(output, inputs[0])
        return op

    def _scatter_one(self, output, input, op: str, opts):
        """One tensor reduce-scattered along the dimension TorchNeuron finds; Gloo splits the first, so
        another one comes first for Gloo and the result goes back into the caller's layout."""
        dim, padded_in, padded_out = rules.scatter_dim(input.shape, output.shape, self.size())
        source = input.reshape(padded_in).movedim(dim, 0).contiguous()
        direct = dim == 0 and output.is_contiguous()
        target = output.view(padded_out) if direct else source.new_empty((padded_out[dim], *source.shape[1:]))
        self._check(f"reduce_scatter_tensor({tensor_text(target)}, {tensor_text(source)}, {op})")
        work = self._stock._reduce_scatter_base(target, source, _gloo_options(dist.ReduceScatterOptions(), opts, op))
        if direct:
            return self._averaged(work, [output]) if op == "AVG" else work
        work.wait()
        if op == "AVG":
            _average([target], self.size())
        with torch.no_grad():
            output.copy_(target.movedim(0, dim).reshape(output.shape))
        return _done([output])

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        rules.on_neuron([output, input])
        op = self._scatter_checks(output, [input], opts)
        if op == "PREMUL_SUM":
            input = _scaled([input], opts)[0]
        return self._scatter_one(output, input, op, opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        rules.on_neuron([*outputs, *inputs])
        pairs = [(o, i) for o, i in zip(outputs, inputs) if i.numel()]  # TorchNeuron skips empty inputs
        if len(pairs) <= 1:
            return self.reduce_scatter_single(*pairs[0], opts) if pairs else _done(outputs)
        outs, ins = [o for o, _ in pairs], [i for _, i in pairs]
        op = rules.reduce_type("reduce_scatter", opts)
        rules.same_trailing_shape(ins)
        size = self.size()
        chunks = [t.shape[0] // size for t in ins]
        # TorchNeuron's interleaving: rank r's chunk of every tensor, rank after rank, in one collective.
        source = torch.cat([t.narrow(0, r * c, c) for r in range(size) for t, c in zip(ins, chunks)])
        target = source.new_empty((sum(chunks), *source.shape[1:]))
        self._scatter_checks(target, [source], opts)
        self._check(f"reduce_scatter_tensor({tensor_text(target)}, {tensor_text(source)}, {op})")
        self._stock._reduce_scatter_base(target, source, _gloo_options(dist.ReduceScatterOptions(), opts, op)).wait()
        if op == "AVG":
            _average([target], size)
        with torch.no_grad():
            for out, part in zip(outs, target.split(chunks)):
                out.copy_(part)
        return _done(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        mine = self.rank() == opts.rootRank
        if mine:
            assert len(input_lists[0]) == self.size(), "Incorrect number of inputs for scatter"
        # TorchNeuron: a reduce_scatter (SUM) of the root's inputs and the other ranks' zeros.
        inputs = list(input_lists[0]) if mine else [torch.zeros_like(outputs[0])] * self.size()
        rules.on_neuron([*outputs, *inputs])
        self._scatter_checks(outputs[0], inputs, dist.ReduceScatterOptions())
        rules.one_input_per_rank(outputs[0], inputs, self.size())
        self._check(f"scatter({tensors_text(outputs)}, src={opts.rootRank})")
        if not 0 <= opts.rootRank < self.size():  # no rank is the root: every rank sends zeros
            with torch.no_grad():
                outputs[0].zero_()
            return _done(outputs)
        return self._stock.scatter(outputs, input_lists, opts)

    # -- all_to_all

    def alltoall(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        rules.on_neuron([*outputs, *inputs])
        if all(t.numel() == 0 for t in inputs):
            return _done(outputs)
        ranks, world = dist.get_process_group_ranks(self), dist.get_world_size()
        if world % len(ranks):
            raise ValueError(f"Cannot create global_replica_group when world_size:{world} is not divisible by "
                             f"group_size: {len(ranks)}. Make the world a multiple of the group's size.")
        rules.all_to_all_groups(_global_groups(ranks, world))
        rules.all_to_all_inputs(inputs, self.size())
        self._check(f"all_to_all({tensors_text(inputs)})")
        if all(o.shape == inputs[0].shape and o.is_contiguous() for o in outputs):
            return self._stock.alltoall(list(outputs), list(inputs), opts)
        received = [torch.empty_like(t) for t in inputs]
        self._stock.alltoall(received, list(inputs), opts).wait()
        with torch.no_grad():  # TorchNeuron copies each rank's chunk into the caller's output
            for out, chunk in zip(outputs, received):
                out.copy_(chunk)
        return _done(outputs)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        size = self.size()
        rules.even_splits(output_splits, "output", size)
        rules.even_splits(input_splits, "input", size)
        ins = torch.split(input, list(input_splits) if input_splits else input.shape[0] // size)
        outs = torch.split(output, list(output_splits) if output_splits else output.shape[0] // size)
        return self.alltoall(list(outs), list(ins), opts)

    alltoall_base = all_to_all_single

    # -- barrier and point-to-point

    def barrier(self, opts=None):
        if self.size() != dist.get_world_size():
            raise NotImplementedError(
                f"Barrier is implemented only for default group, called barrier on {self!r} (group "
                f"{self.group_name!r}). TorchNeuron's group has a barrier for the default group only: call "
                "dist.barrier() without a group.")
        self._check("barrier()")
        return self._stock.barrier(opts) if opts is not None else self._stock.barrier()

    def send(self, tensors, dst, tag):
        return self._stock.send(tensors, dst, tag)

    def recv(self, tensors, src, tag):
        return self._stock.recv(tensors, src, tag)

