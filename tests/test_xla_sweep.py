"""A representative part of the xla sweep (`make sweep-xla` runs all of op_db and module_db): modules
and ops whose lowering needs TorchNeuron's own decompositions or the private pipeline's stand-ins,
compiled forward and backward under the xla executor against CPU eager; and the tables' arithmetic."""
import pytest

from helpers import xla_sweep

MODULES = ["nn.Conv1d", "nn.ConvTranspose2d", "nn.AvgPool2d", "nn.AdaptiveAvgPool3d", "nn.AdaptiveMaxPool2d",
           "nn.ReplicationPad2d", "nn.CircularPad1d", "nn.LSTMCell", "nn.Embedding"]
OPS = ["topk", "argsort", "histc", "nn.functional.max_pool3d", "diag_embed",
       # stand-ins for the private pipeline (docs/compiled-coverage.md)
       "scatter_reduce.amax", "index_reduce.prod", "median", "nanmedian", "kthvalue", "trace", "nn.functional.pdist",
       "prod", "_upsample_bilinear2d_aa", "searchsorted", "masked_scatter", "put", "hypot", "rsub",
       "diagonal_scatter", "frexp", "empty_like", "amax", "cummax", "cdist"]
# The newest stand-ins, in make test-long (CI runs it): minutes of compiling that make test's 10
# minutes cannot hold; tests/test_decompositions.py checks each against the op on CPU in make test.
LONG_OPS = ["mode", "histogram", "histogramdd", "_segment_reduce.lengths", "_segment_reduce.offsets",
            "nn.functional.embedding_bag", "nn.functional.grid_sample", "grid_sampler_2d", "grid_sampler_3d"]


@pytest.mark.parametrize("name", MODULES)
def test_module_trains_and_evaluates_under_xla_like_cpu(name):
    [info] = xla_sweep.module_infos([name])
    for training in (True, False):
        outcome = xla_sweep.module_case(info, training)
        assert outcome["status"] == "pass", (name, training, outcome)


@pytest.mark.parametrize("name", [*OPS, *(pytest.param(name, marks=pytest.mark.long) for name in LONG_OPS)])
def test_op_forward_and_backward_under_xla_like_cpu(name):
    [op] = xla_sweep.op_infos([name])
    for backward in (False, True):
        outcome = xla_sweep.op_case(op, backward)
        assert outcome["status"] in ("pass", "no-backward"), (name, backward, outcome)


def test_a_case_that_does_not_lower_is_classified_with_op_and_stage():
    [op] = xla_sweep.op_infos(["cholesky"])
    outcome = xla_sweep.op_case(op, False)
    assert outcome["status"] == "lowering" and outcome["detail"].startswith("aten.cholesky ("), outcome


def test_a_call_that_raises_eagerly_on_neuron_too_is_not_counted():
    """tensor_split wants its sections tensor on the CPU, eager too: not the compiler's failure."""
    [op] = xla_sweep.op_infos(["tensor_split"])
    outcome = xla_sweep.op_case(op, False)
    assert outcome["status"] == "device-eager-raises" and "device-eager-raises" in xla_sweep.NOT_COUNTED, outcome


def test_tables_count_only_the_compilers_cases_and_give_each_failure_its_reason():
    results = {"modules": {"nn.A train": {"status": "pass"}, "nn.A eval": {"status": "dynamo-skips"},
                           "nn.B train": {"status": "lowering", "detail": "aten.x (stablehlo)"}},
               "ops": {"f forward": {"status": "pass"}, "f backward": {"status": "no-backward"},
                       "g forward": {"status": "pass"}, "g backward": {"status": "mismatch", "detail": "d"}}}
    text = xla_sweep.markdown(results, {"nn.B": "because"}, {"mismatch": "ours to fix"})
    assert "ModuleInfo cases: **1 of 2 pass (50.0%)**" in text and "OpInfo ops: **1 of 2 pass (50.0%)**" in text
    # agreement: what passes, and what fails here and on Trainium too (nn.B's reason does not say so)
    assert text.count("agreement with TorchNeuron's compile **1 of 2 (50.0%)**") == 2
    assert "| nn.B train | lowering | aten.x (stablehlo) | because |" in text
    assert "| g backward | mismatch | d | ours to fix |" in text
    assert "of the 1 that do not, 0 fail on Trainium too" in text and text.count("1 are ours") == 2


def test_agreement_counts_the_failures_trainium_shares():
    results = {"modules": {"nn.A train": {"status": "pass"}, "nn.B train": {"status": "lowering", "detail": "x"},
                           "nn.C train": {"status": "mismatch", "detail": "d"}},
               "ops": {"f forward": {"status": "pass"}, "f backward": {"status": "lowering", "detail": "x"},
                       "g forward": {"status": "pass"}, "g backward": {"status": "pass"},
                       "h forward": {"status": "error", "detail": "e"}}}
    text = xla_sweep.markdown(results, {"nn.B": "fails on Trainium too: because", "f": "fails on Trainium too: f"},
                              {"mismatch": "ours to fix", "error": "ours to fix"})
    assert "ModuleInfo cases: **1 of 3 pass (33.3%)**; agreement with TorchNeuron's compile **2 of 3 (66.7%)**" in text
    assert "OpInfo ops: **1 of 3 pass (33.3%)**; agreement with TorchNeuron's compile **2 of 3 (66.7%)**" in text


def test_a_failure_takes_the_reason_of_its_longest_listed_prefix():
    results = {"modules": {}, "ops": {"nn.f.pad.circular forward": {"status": "lowering", "detail": "x"},
                                      "nn.f.pad.reflect forward": {"status": "lowering", "detail": "x"},
                                      "nn.g forward": {"status": "lowering", "detail": "x"}}}
    text = xla_sweep.markdown(results, {"nn.f.pad.circular": "empty", "nn.f": "f's", "nn": "any nn"},
                              {"lowering": "default"})
    assert "| nn.f.pad.circular forward | lowering | x | empty |" in text
    assert "| nn.f.pad.reflect forward | lowering | x | f's |" in text and "| nn.g forward | lowering | x | any nn |" in text


def test_tables_name_no_path_of_this_machine():
    import os

    inside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch_neuronx", "x.py")
    results = {"modules": {}, "ops": {"f forward": {"status": "error", "detail": "/opt/venv/lib/python3.11/"
                                                   f"site-packages/torch/a.py:1 and {inside}:2"}}}
    text = xla_sweep.markdown(results, {}, {"error": "ours"})
    assert "site-packages/torch/a.py:1 and torch_neuronx/x.py:2" in text and "/opt/" not in text
