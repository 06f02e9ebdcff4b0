"""nn.MultiheadAttention's inference fast path (``aten::_native_multi_head_attention``) as TorchNeuron
runs it (its python_ops/native_multi_head_attention.py, tests/python_ops/test_native_multi_head_attention.py):
CPU's values on the same bytes, empty weights when none are asked for, mask_type=1 causal, and its
refusals of a mask and of weights: raised under Trainium's eager semantics, a would-fail finding at
the user's line by default, and silent where its kernel runs."""
import inspect
import warnings

import pytest
import torch

import torch_neuronx
from torch_neuronx.python_ops import trainium_semantics

N = "neuron"


def here() -> str:
    frame = inspect.currentframe().f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _layer():
    """An eval-mode layer on CPU and its copy on neuron."""
    torch.manual_seed(0)
    cpu = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    neuron = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    neuron.load_state_dict(cpu.state_dict())
    return cpu, neuron.to(N)


def _mha_findings(report) -> list[dict]:
    return [f for f in report.to_dict()["findings"] if f["kind"] == "mha-fast-path"]


@pytest.mark.parametrize("need_weights", [True, False])
def test_the_fast_path_computes_cpus_values_and_empty_weights_when_none_are_asked(need_weights):
    cpu, neuron = _layer()
    x = torch.randn(2, 6, 32)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_neuronx.clear_op_tracking()
        xn = x.to(N)  # the same tensor thrice: self-attention, the fast path
        out, weights = neuron(xn, xn, xn, need_weights=need_weights)
        assert "aten::_native_multi_head_attention" in torch_neuronx.get_executed_ops()
        expected, expected_weights = cpu(x, x, x, need_weights=need_weights)
        masked, _ = neuron(xn, xn, xn, key_padding_mask=pad.to(N), need_weights=need_weights)
        expected_masked, _ = cpu(x, x, x, key_padding_mask=pad, need_weights=need_weights)
    assert torch.equal(out.cpu(), expected) and torch.equal(masked.cpu(), expected_masked)
    if need_weights:
        assert torch.equal(weights.cpu(), expected_weights)
    else:  # CPU gives None; TorchNeuron an empty tensor
        assert expected_weights is None and weights.device.type == N and weights.numel() == 0


def test_mask_type_1_without_a_mask_is_causal_and_short_sequences_warn():
    torch.manual_seed(0)
    x, w, b, pw, pb = torch.randn(1, 8, 16), torch.randn(48, 16), torch.randn(48), torch.randn(16, 16), torch.randn(16)
    causal = torch.ones(8, 8, dtype=torch.bool).triu(1)
    expected, _ = torch.ops.aten._native_multi_head_attention(x, x, x, 16, 4, w, b, pw, pb, causal, False, True, 0)
    plain, _ = torch.ops.aten._native_multi_head_attention(x, x, x, 16, 4, w, b, pw, pb, None, False, True, 1)
    assert not torch.equal(plain, expected)  # CPU's kernel ignores mask_type without a mask
    args = [t.to(N) for t in (x, x, x)] + [16, 4] + [t.to(N) for t in (w, b, pw, pb)]
    with pytest.warns(UserWarning, match="Sequence length 8 is not a multiple of 512"):
        got, weights = torch.ops.aten._native_multi_head_attention(*args, mask=None, need_weights=False, mask_type=1)
    assert torch.equal(got.cpu(), expected) and weights.numel() == 0


def test_a_mask_or_weights_raise_under_trainium_semantics_in_torchneurons_words():
    cpu, neuron = _layer()
    x = torch.randn(1, 4, 32).to(N)
    with torch.no_grad(), torch_neuronx.eager_semantics(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NotImplementedError, match=r"need_weights=True.*not yet supported.*need_weights=False"):
            neuron(x, x, x)
        with pytest.raises(NotImplementedError, match="Arbitrary mask tensors not yet supported"):
            neuron(x, x, x, key_padding_mask=torch.zeros(1, 4, dtype=torch.bool, device=N), need_weights=False)
        out, _ = neuron(x, x, x, need_weights=False)  # what its kernel runs
    assert out.shape == (1, 4, 32)


def test_the_report_finds_the_refused_calls_at_their_line_and_nothing_else(collect):
    cpu, neuron = _layer()
    x = torch.randn(1, 4, 32).to(N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            neuron(x, x, x, need_weights=False)
        neuron.train()(x, x, x)  # training: not the fast path, TorchNeuron runs its parts
        assert _mha_findings(collect()) == []
        with torch.no_grad():
            neuron.eval()(x, x, x); weights_site = here()
            mask = torch.zeros(4, 4, dtype=torch.bool, device=N)
            neuron(x, x, x, attn_mask=mask, need_weights=False); mask_site = here()
    found = {f["site"]: f for f in _mha_findings(collect())}
    assert set(found) == {weights_site, mask_site}
    assert found[weights_site]["severity"] == "would-fail" and "need_weights" in found[weights_site]["details"][0]
    assert "mask" in found[mask_site]["details"][0]


def test_refusal_follows_torchneurons_order():
    assert trainium_semantics.mha_refusal(True, True) == trainium_semantics.MHA_MASK_REFUSED
    assert trainium_semantics.mha_refusal(False, True, False) == trainium_semantics.MHA_PER_HEAD_REFUSED
    assert trainium_semantics.mha_refusal(False, True) == trainium_semantics.MHA_WEIGHTS_REFUSED
    assert trainium_semantics.mha_refusal(False, False) is None
