"""torch_neuronx.utils, TorchNeuron's helpers: its environment switches and their defaults, the platform
answers from the emulated instance, and the tensor helpers (compared with plain PyTorch)."""
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from packaging.version import Version

from torch_neuronx import utils
from helpers.isolated import environment, run


def test_import_sets_torchneurons_environment_defaults_and_keeps_the_users():
    env = {k: v for k, v in environment(NEURON_LAUNCH_BLOCKING="1", TORCH_NEURONX_ENABLE_STABLEHLO="false").items()
           if k not in utils.ENV_DEFAULTS or k == "NEURON_LAUNCH_BLOCKING"}  # this process has them all
    code = textwrap.dedent("""
        import os, torch
        from torch_neuronx import utils
        print(*(os.environ.get(name) for name in sorted(utils.ENV_DEFAULTS)))
        print(utils.is_sync_mode_enabled(), utils.use_mlir_aten_ops(), utils.is_stablehlo_enabled())
    """)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # sorted: NEURON_LAUNCH_BLOCKING (the user's), FALLBACK_ONLY..., MLIR_ATEN_OPS, RETAIN_DEVICE_MODE
    assert r.stdout.splitlines() == ["1 1 1 0", "True True False"]


@pytest.mark.parametrize("instance, lnc, target, multiplier, e4m3, e4m3fn", [
    ("trn2.3xlarge", None, "trn2", 1, True, False),
    ("trn2.3xlarge", "1", "trn2", 2, True, False),
    ("trn3", None, "trn3", 1, False, True),
    ("trn1.2xlarge", None, "trn1", 1, False, True),
])
def test_platform_answers_come_from_the_emulated_instance(instance, lnc, target, multiplier, e4m3, e4m3fn):
    env = {"TORCH_NEURONX_INSTANCE_TYPE": instance, **({"NEURON_LOGICAL_NC_CONFIG": lnc} if lnc else {})}
    r = run("""
        from torch_neuronx import utils
        print(utils.get_platform_target(), utils.get_lnc_setting(), utils.get_logical_neuron_cores(),
              utils.get_worker_multiplier(), utils.is_float8_e4m3_supported(), utils.is_float8_e4m3fn_supported(),
              utils.is_mxocp_supported())
    """, **env)
    assert r.returncode == 0, r.stderr
    default_lnc = "1" if target == "trn1" else "2"
    assert r.stdout.split() == [target, lnc or default_lnc, lnc or default_lnc, str(multiplier), str(e4m3),
                                str(e4m3fn), str(e4m3fn)]


def test_pytree_helpers_move_and_flatten_like_to():
    cpu = {"a": torch.arange(3.0), "b": [torch.ones(2), (torch.zeros(1, dtype=torch.int64), 5)], "c": "x"}
    moved = utils.move_pytree_to_neuron(cpu)
    assert moved["b"][1][0].device.type == "neuron" and moved["c"] == "x" and isinstance(moved["b"][1], tuple)
    back = utils.move_pytree_to_cpu(moved)
    torch.testing.assert_close(back["a"], cpu["a"], rtol=0, atol=0)
    assert back["b"][1][0].device.type == "cpu" and back["b"][1][1] == 5
    flat = utils.flatten_tensors([moved["a"], [moved["b"][0], (moved["b"][1][0],)], 7])
    assert [t.shape for t in flat] == [(3,), (2,), (1,)]
    assert utils.get_device_from_tensors([[], (moved["b"][0],)]) == torch.device("neuron:0")
    assert utils.get_device_from_tensors([]) == torch.device("neuron", torch.neuron.current_device())
    x = torch.ones(2, device="neuron")
    assert utils.cast_dtype_if_needed(x, None) is x and utils.cast_dtype_if_needed(x, torch.float32) is x
    assert utils.cast_dtype_if_needed(x, torch.bfloat16).dtype == torch.bfloat16


def test_suppress_specific_warnings_hides_only_matching_ones():
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        original = warnings.showwarning
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
        try:
            with utils.suppress_specific_warnings(["noisy"]):
                warnings.warn("a noisy warning")
                warnings.warn("a useful warning")
        finally:
            warnings.showwarning = original
    assert shown == ["a useful warning"]


def test_registered_ops_are_the_dispatchers_neuron_kernels():
    ops = utils.get_neuron_registered_ops()
    names = torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")
    assert "empty" in ops and "empty_strided" in ops and all("." not in op for op in ops)
    assert set(utils.get_neuron_registered_ops(keep_variant=True)) == {name.split("::", 1)[1] for name in names
                                                                        if "::" in name}
    assert utils.get_neuron_registered_ops(as_sorted=True) == sorted(ops)
    assert utils.TORCH_VERSION == Version(torch.__version__)
