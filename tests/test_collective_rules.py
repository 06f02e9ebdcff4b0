"""TorchNeuron's rules for its process group's collectives (torch_neuronx/distributed/rules.py), one by one:
the words of each refusal (TorchNeuron's, then the fix) and the shapes each call takes. The rules applied
by a real group of 2 and 4 ranks: tests/test_distributed.py (tests/distributed/torchneuron_rules.py)."""
import pytest
import torch
import torch.distributed as dist

from torch_neuronx.distributed import rules


def opts(op):
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return o


def test_the_reduce_ops_torchneuron_takes_and_the_ones_it_refuses():
    assert [rules.reduce_type("all_reduce", opts(op)) for op in
            (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MIN, dist.ReduceOp.MAX)] == ["SUM", "AVG", "MIN", "MAX"]
    premul = opts(dist._make_nccl_premul_sum(2.5))
    assert rules.reduce_type("all_reduce", premul, premul=True) == "PREMUL_SUM" and rules.premul_factor(premul) == 2.5
    for op, name in ((dist.ReduceOp.PRODUCT, "PRODUCT"), (dist.ReduceOp.BXOR, "BXOR")):
        with pytest.raises(NotImplementedError) as error:
            rules.reduce_type("reduce_scatter", opts(op))
        assert str(error.value).startswith(
            f"Operation reduce_scatter is not implemented for Neuron. Details: unsupported reduce operation '{name}', "
            "supported ops: ['SUM', 'AVG', 'MIN', 'MAX']. Use SUM, AVG, MIN or MAX")
    with pytest.raises(NotImplementedError, match="unsupported reduce operation 'PREMUL_SUM'"):
        rules.reduce_type("all_reduce", premul)  # the coalesced forms do not scale first


def test_cpu_and_empty_tensors_are_refused_with_the_fix():
    with pytest.raises(ValueError) as error:
        rules.on_neuron([[torch.ones(1)]])
    assert str(error.value).startswith("Expected neuron device, got cpu. TorchNeuron's process group")
    assert "dist.new_group(backend='gloo')" in str(error.value)
    with pytest.raises(NotImplementedError, match=r"tensors cannot be empty, found empty tensors at indices: \[1\]"):
        rules.not_empty("all_reduce", [torch.ones(1), torch.ones(0)])
    with pytest.raises(ValueError, match=r"tensors cannot have zero size in dimension 0, found: tensor\[0\]: "
                                         r"torch.Size\(\[0, 3\]\)"):
        rules.no_zero_dim0([torch.ones(0, 3), torch.ones(())])  # a 0-d tensor has no dimension 0 to be empty


@pytest.mark.parametrize("input, output, size, expected", [
    ((8,), (4,), 2, (0, [8], [4])),
    ((3, 8), (3, 2), 4, (1, [3, 8], [3, 2])),
    ((4,), (1, 2), 2, (1, [1, 4], [1, 2])),  # the shorter shape takes leading ones
    ((5, 5), (5, 5), 1, (0, [5, 5], [5, 5])),
])
def test_a_one_tensor_reduce_scatter_splits_the_dimension_that_differs(input, output, size, expected):
    assert rules.scatter_dim(input, output, size) == expected


@pytest.mark.parametrize("input, output, size, words", [
    ((4, 4), (2, 2), 2, "single tensor scatter can only differ in one dimension, found differences in: "
                        "dim[0]: 4 -> 2, dim[1]: 4 -> 2"),
    ((4,), (4,), 2, "when input and output shapes are identical, replica group must have size 1, got 2"),
    ((9,), (4,), 2, "scatter dimension 0: input size (9) must be evenly divisible by replica group size (2), but "
                    "9 / 2 = 4.5. Expected output size: 4, actual output size: 4"),
])
def test_a_reduce_scatter_of_other_shapes_is_refused_in_torchneurons_words(input, output, size, words):
    with pytest.raises(NotImplementedError) as error:
        rules.scatter_dim(input, output, size)
    assert f"Operation reduce_scatter is not implemented for Neuron. Details: {words}." in str(error.value)


def test_all_to_all_runs_on_the_group_sizes_and_start_ranks_trainium_supports():
    rules.all_to_all_groups([[0, 1, 2, 3], [4, 5, 6, 7]])
    rules.all_to_all_groups([list(range(32))])
    with pytest.raises(NotImplementedError, match="unsupported world size 2, supported sizes: 4, 8, 16, or "
                                                  "multiples of 32"):
        rules.all_to_all_groups([[0, 1]])
    with pytest.raises(NotImplementedError, match=r"replica group start ranks must be multiples of world size \(4\), "
                                                  r"found: group\[1\] \[1, 3, 5, 7\] starts at rank 1\."):
        rules.all_to_all_groups([[0, 2, 4, 6], [1, 3, 5, 7]])  # the group's ranks, then the others


def test_all_to_all_single_takes_no_split_sizes_or_all_ones():
    for splits in (None, [], [1, 1, 1, 1]):
        rules.even_splits(splits, "input", 4)
    with pytest.raises(NotImplementedError, match=r"alltoall_base: Only even split sizes are supported. Got "
                                                  r"input_split_sizes: \[2, 2, 2, 2\]"):
        rules.even_splits([2, 2, 2, 2], "input", 4)  # even, but not ones: TorchNeuron's check
    with pytest.raises(NotImplementedError, match=r"output_split_sizes length \(2\) must match group_size \(4\)"):
        rules.even_splits([3, 1], "output", 4)


def test_the_gathers_output_shapes():
    rules.gathered_output(torch.empty(6, 2), torch.empty(3, 2), 2)
    with pytest.raises(NotImplementedError, match=r"output shape mismatch, expected \(6, 2\), got torch.Size\(\[12\]\)"):
        rules.gathered_output(torch.empty(12), torch.empty(3, 2), 2)
    with pytest.raises(NotImplementedError, match=r"output shape mismatches: pair\[1\]: expected \(4,\), got "
                                                  r"torch.Size\(\[3\]\)"):
        rules.gathered_pairs([torch.empty(2), torch.empty(3)], [torch.empty(1), torch.empty(2)], 2)
    inputs = [torch.empty(2), torch.empty(3)]
    rules.gathered_per_tensor(inputs, [torch.empty(2), torch.empty(2), torch.empty(3), torch.empty(3)], 2)
    with pytest.raises(NotImplementedError, match=r"output tensor at index 1 has shape torch.Size\(\[3\]\), expected "
                                                  r"torch.Size\(\[2\]\) to match input tensor 0"):
        rules.gathered_per_tensor(inputs, [torch.empty(2), torch.empty(3), torch.empty(2), torch.empty(3)], 2)


def test_a_root_outside_the_group_is_refused():
    rules.root(3, 4)
    with pytest.raises(ValueError, match="Invalid rootRank 4 for broadcast with world size 4. Pass a rank of the "
                                         "group: 0 to 3."):
        rules.root(4, 4)
