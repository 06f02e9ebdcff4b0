"""Functional collectives in a graph lowered for readiness, as TorchNeuron lowers them (its
CollectiveLegalization pass and its own torch-mlir): all_reduce, all_gather_into_tensor,
reduce_scatter_tensor and all_to_all_single lower; broadcast and the coalesced forms do not, and the
failure names that op and the user's line, not the first op of the graph."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_neuronx.neuron_dynamo_backend.faithful import collectives, lowering

c10d = torch.ops._c10d_functional
aten = torch.ops.aten
USER_TRACE = 'File "/home/user/train.py", line {line}, in forward\n    y = f(x)\n'
LIBRARY_TRACE = f'File "{torch.__file__.rsplit("/", 1)[0]}/distributed/_functional_collectives.py", line 155, in f\n'


def _graph(collective, extra, out_rows, line=7):
    """x -> t(x) @ x -> collective (a result of ``out_rows`` rows) -> wait -> * 2, on fake tensors,
    with stack traces: the collective's ends inside torch.distributed, as Dynamo records it."""
    graph = torch.fx.Graph()
    with FakeTensorMode() as mode:
        x_node = graph.placeholder("x")
        x_node.meta["val"] = mode.from_tensor(torch.empty(4, 4))

        def call(target, args, rows, trace=USER_TRACE.format(line=3)):
            node = graph.call_function(target, args)
            node.meta["val"], node.meta["stack_trace"] = torch.empty(rows, 4), trace
            return node

        mm = call(aten.mm.default, (call(aten.t.default, (x_node,), 4), x_node), 4)
        sent = call(collective, (mm, *extra, "0"), out_rows, trace=USER_TRACE.format(line=line) + LIBRARY_TRACE)
        waited = call(c10d.wait_tensor.default, (sent,), out_rows)
        graph.output((call(aten.mul.Tensor, (waited, 2.0), out_rows),))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("op, extra, rows", [(c10d.all_reduce.default, ("sum",), 4),
                                             (c10d.all_gather_into_tensor.default, (2,), 8),
                                             (c10d.reduce_scatter_tensor.default, ("sum", 2), 2),
                                             (c10d.all_to_all_single.default, ([2, 2], [2, 2]), 4),
                                             (c10d.all_to_all_single.default, ([3, 3], [2, 2]), 6)])
def test_the_collectives_torchneuron_legalizes_lower_with_their_result_shape(op, extra, rows):
    pytest.importorskip("torch_mlir")
    gm = _graph(op, extra, rows)
    assert collectives.stand_in(gm) == 1
    assert not [n for n in gm.graph.nodes if "c10d" in str(n.target)]
    (result,) = gm.graph.find_nodes(op="output")[0].args[0]
    assert tuple(result.meta["val"].shape) == (rows, 4)
    lowered = lowering.lower(gm)
    assert "stablehlo." in lowered.stablehlo and lowered.op_counts


def test_broadcast_is_not_legalized_and_fails_naming_itself_at_the_users_line():
    pytest.importorskip("torch_mlir")
    gm = _graph(c10d.broadcast.default, (0,), 4, line=11)
    assert collectives.stand_in(gm) == 0
    with pytest.raises(lowering.LoweringError) as raised:
        lowering.lower(gm)
    assert raised.value.op == "_c10d_functional.broadcast", raised.value
    assert raised.value.site == "/home/user/train.py:11", raised.value.site
