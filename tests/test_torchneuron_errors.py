"""Bad input fails as on TorchNeuron: the exception type and words its kernels raise (its torch-mlir
ops' checks, the meta functions it traces through; csrc/error_words.cpp), then how to fix the call.
CPU, the oracle, must refuse the same call: only the words change."""
import re

import pytest
import torch

N = "neuron"


CASES = [
    ("flip", lambda d: torch.flip(torch.ones(2, 2, device=d), [1, 1]),
     RuntimeError, "duplicate value in the list of dims"),
    ("foreach scalar list", lambda d: torch._foreach_add([torch.ones(3, device=d)] * 3, [1.0, 2.0]),
     ValueError, "Tensor list must have same number of elements as scalar list"),
    ("index out of bounds", lambda d: torch.ones(4, 4, device=d)[torch.tensor([1, 15], device=d), :],
     RuntimeError, "index 15 is out of bounds for dimension 0 with size 4"),
    ("index_copy slice", lambda d: torch.zeros(5, 4, device=d).index_copy(
        0, torch.tensor([0, 4, 2], device=d), torch.ones(3, 3, device=d)),
     ValueError, re.escape("Incompatible shapes for broadcasting: (3, 3) and requested shape (3, 4)")),
    ("index_copy rank", lambda d: torch.empty(0, device=d).index_copy(
        0, torch.tensor([0, 4, 2], device=d), torch.ones(3, 3, device=d)),
     ValueError, re.escape("Incompatible shapes for broadcasting: (3, 3) and requested shape (3,)")),
    ("index_select float index", lambda d: torch.index_select(
        torch.ones(3, 4, device=d), 0, torch.tensor([0.0, 2.0], device=d)),
     TypeError, re.escape("index_select(): Expected dtype int32 or int64 for index")),
    ("index_select_backward float index", lambda d: torch.ops.aten.index_select_backward(
        torch.ones(2, 4, device=d), (3, 4), 0, torch.tensor([0.0, 2.0], device=d)),
     TypeError, re.escape("index_select_backward(): Expected dtype int32/int64 for index but got: torch.float32")),
    ("mm reduction dim", lambda d: torch.mm(torch.ones(3, 4, device=d), torch.ones(5, 6, device=d)),
     RuntimeError, re.escape("a and b must have same reduction dim, but got [3, 4] X [5, 6].")),
    ("mm rank", lambda d: torch.mm(torch.ones(2, 3, 4, device=d), torch.ones(4, 5, device=d)),
     RuntimeError, "a must be 2D"),
]


@pytest.mark.parametrize("name, call, error, words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_in_torchneurons_words_where_cpu_fails(name, call, error, words):
    with pytest.raises(Exception) as on_cpu:
        call("cpu")
    with pytest.raises(error, match=words) as on_neuron:
        call(N)
    assert str(on_neuron.value) != str(on_cpu.value)
    # after TorchNeuron's words, a fix (a sentence of ours)
    assert len(str(on_neuron.value).split("\n")[0]) > len(re.sub(r"\\", "", words)) + 10


def test_good_input_to_the_checked_ops_still_equals_cpu():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    assert torch.equal(torch.mm(a.to(N), b.to(N)).cpu(), torch.mm(a, b))
    idx = torch.tensor([0, 2])
    assert torch.equal(torch.index_select(a.to(N), 1, idx.to(N)).cpu(), torch.index_select(a, 1, idx))
    src = torch.randn(2, 4)
    assert torch.equal(a.to(N).index_copy(0, idx.to(N), src.to(N)).cpu(), a.index_copy(0, idx, src))


def test_copy_from_and_resize_takes_cpu_to_neuron_only_and_resizes_only_an_empty_dst():
    """TorchNeuron's CopyKernel.cpp: CPU -> neuron, into a dst of the same size or an empty one."""
    src = torch.randn(10, 20)
    dst = torch.empty(0, device=N)
    out = torch._copy_from_and_resize(src, dst)
    assert out is dst and dst.shape == (10, 20) and torch.equal(dst.cpu(), src)
    same = torch.empty(10, 20, device=N)
    assert torch.equal(torch._copy_from_and_resize(src, same).cpu(), src)
    with pytest.raises(RuntimeError, match="only support copy with same size, or dst.numel"):
        torch._copy_from_and_resize(src, torch.empty(5, 5, device=N))
    for source, target in [(src.to(N), torch.empty(0, device=N)), (src.to(N), torch.empty(0))]:
        with pytest.raises(RuntimeError, match="only support copy from cpu tensor to neuron tensor"):
            torch._copy_from_and_resize(source, target)
