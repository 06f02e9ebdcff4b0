"""torch.neuron and torch.accelerator: the device count, the current device (set_device, the
device guard), device indices and their errors, and tensors of two devices in one op."""
import pytest
import torch

from helpers.isolated import run

N = "neuron"


def test_neuron_is_torchs_accelerator():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch._C._get_accelerator() == torch.device("neuron")
    assert torch.accelerator.device_count() == torch.neuron.device_count() == 4
    assert torch._C._get_privateuse1_backend_name() == "neuron"


def test_device_api_basics():
    assert torch.neuron.is_available()
    assert torch.neuron.current_device() == 0
    assert torch.neuron.get_amp_supported_dtype() == [torch.float32, torch.float16, torch.bfloat16]
    assert torch.neuron.is_bf16_supported()
    torch.neuron.synchronize()
    torch.neuron.synchronize("neuron:1")
    torch.neuron.empty_cache()
    torch.neuron.init()
    assert torch.neuron.is_initialized()


def test_set_device_and_context():
    try:
        torch.neuron.set_device(2)
        assert torch.neuron.current_device() == 2
        assert torch.empty(1, device=N).device == torch.device("neuron:2")
        assert torch.ones(2).to(N).device.index == 2
        with torch.neuron.device(3):
            assert torch.neuron.current_device() == 3
            assert torch.accelerator.current_device_index() == 3
        assert torch.neuron.current_device() == 2
        torch.neuron.set_device(torch.device("neuron:1"))
        assert torch.neuron.current_device() == 1
        torch.accelerator.set_device_index(0)
        assert torch.neuron.current_device() == 0
        x = torch.zeros(1, device="neuron:3")
        with torch.neuron.device_of(x):
            assert torch.neuron.current_device() == 3
    finally:
        torch.neuron.set_device(0)


def test_ops_follow_their_inputs_device():
    x = torch.randn(4, device="neuron:2")
    assert (x + x).device.index == 2
    assert x.sum().device.index == 2
    assert torch.neuron.current_device() == 0


@pytest.mark.parametrize("bad", [4, 99, -2])
def test_bad_device_index_names_the_valid_range(bad):
    # TorchNeuron's words: set_device's ValueError, and the runtime's RuntimeError for a tensor.
    with pytest.raises(ValueError, match=r"^Invalid device id: %d. Valid range is 0 to 3\. " % bad):
        torch.neuron.set_device(bad)
    with pytest.raises(ValueError, match=r"^Invalid device id: %d\b" % bad):
        torch.neuron.device(bad).__enter__()  # checked on entry, as there
    if bad >= 0:
        with pytest.raises(RuntimeError, match=r"^Device index %d is out of range. Valid range is 0 to 3 for "
                                               r"this process: .*NEURON_RT_VISIBLE_CORES" % bad):
            torch.empty(2, device=f"neuron:{bad}")
        with pytest.raises(RuntimeError, match=r"Valid range is 0 to 3 for this process"):
            torch.ones(2).to(f"neuron:{bad}")
    assert torch.neuron.current_device() == 0


def test_set_device_takes_an_index_or_a_torch_device_as_on_torchneuron():
    # TorchNeuron passes what is not a torch.device on to torch_neuronx.set_device, which compares it
    # with the device count: a string fails there, so it fails here too, saying what to pass.
    with pytest.raises(TypeError, match=r"expects a device index \(int\), got 'neuron:1'.*Pass its index"):
        torch.neuron.set_device("neuron:1")
    with pytest.raises(ValueError, match="Expected neuron device, got cpu"):
        torch.neuron.synchronize("cpu")
    with pytest.raises(ValueError, match="Invalid device specification"):
        torch.neuron.synchronize(1.5)
    assert torch.neuron.current_device() == 0


def test_package_top_has_torchneurons_device_api():
    import torch_neuronx
    assert torch_neuronx.device_count() == 4 and torch_neuronx.current_device() == 0
    for name in ("current_stream", "default_stream", "set_stream", "stream", "StreamContext", "Stream", "Event",
                 "synchronize", "get_device_properties", "empty_cache", "memory_stats", "memory_summary",
                 "device", "_lazy_init"):
        assert getattr(torch_neuronx, name) is getattr(torch.neuron, name), name
    assert torch_neuronx.is_neuron_runtime_initialized() == torch.neuron.is_initialized()
    assert torch_neuronx.get_dynamo_metrics is torch.neuron.get_dynamo_metrics
    assert torch_neuronx.default_stream() == torch.neuron.default_stream()
    with pytest.raises(ValueError, match="^Invalid device id: 4. Valid range is 0 to 3"):
        torch_neuronx.set_device(4)
    from torch_neuronx.memory import memory_stats  # TorchNeuron's module paths
    from torch_neuronx.streams import Event
    assert memory_stats is torch.neuron.memory_stats and Event is torch.neuron.Event
    # TorchNeuron's compiled internals are not provided, and say so.
    assert not hasattr(torch_neuronx, "_C")
    with pytest.raises(ImportError, match="torch_neuronx._C is TorchNeuron's compiled internals"):
        import torch_neuronx._C  # noqa: F401


def test_torch_neuron_set_device_goes_through_the_package(monkeypatch):
    import torch_neuronx
    calls = []
    monkeypatch.setattr(torch_neuronx, "set_device", calls.append)
    torch.neuron.set_device(torch.device("neuron:2"))
    torch.neuron.set_device(3)
    torch.neuron.set_device(None)  # the current device
    assert calls == [2, 3, 0] and torch.neuron.current_device() == 0


def test_threads_that_never_chose_use_the_first_device_set_device_chose():
    # TorchNeuron's process default: the first set_device in the process is the device of every thread
    # that never chose one; later calls move only their own thread.
    r = run("""
        import threading, torch
        seen = []
        def look():
            seen.append((torch.neuron.current_device(), torch.empty(1, device="neuron").device.index))
        torch.neuron.set_device(2)
        torch.neuron.set_device(1)
        thread = threading.Thread(target=look)
        thread.start(); thread.join()
        print(torch.neuron.current_device(), seen)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1 [(2, 2)]"


def test_properties_and_name_are_torchneurons():
    props = torch.neuron.get_device_properties("neuron:1")
    assert (props.name, props.chip, props.core_arch, props.core_id) == ("trn2", "Trainium2", "NeuronCore-v3", 1)
    assert torch.neuron.get_device_properties(1) == props == torch.neuron.get_device_properties(torch.device(N, 1))
    assert props.total_memory == torch.neuron.mem_get_info(1)[1]
    assert torch.neuron.get_device_name() == "neuron:0" and torch.neuron.get_device_name(3) == "neuron:3"
    assert torch.neuron.get_device_name(torch.device("neuron:2")) == "neuron:2"
    with pytest.raises(ValueError, match="Incorrect device argument found, expected torch.device or int type"):
        torch.neuron.get_device_name("neuron:1")
    for bad in (4, -1, 2**32):
        with pytest.raises(ValueError, match=f"^Invalid device id: {bad}"):
            torch.neuron.get_device_properties(bad)


def test_mixing_neuron_and_cpu_tensors_is_a_device_mismatch():
    # TorchNeuron's words (its python_ops/base.py), then the devices and the fix
    mismatch = "is on cpu device, expected neuron: all tensors must be on the same device, found neuron:0 and cpu"
    with pytest.raises(RuntimeError, match="^Non-scalar tensor argument of aten::add.Tensor " + mismatch):
        torch.ones(3, device=N) + torch.ones(3)
    with pytest.raises(RuntimeError, match=mismatch):
        torch.mm(torch.ones(2, 2, device=N), torch.ones(2, 2))
    with pytest.raises(RuntimeError, match=mismatch):
        torch.where(torch.ones(3, device=N) > 0, torch.ones(3), torch.zeros(3, device=N))
    with pytest.raises(RuntimeError, match="neuron:0 and neuron:1"):
        torch.ones(3, device=N) * torch.ones(3, device="neuron:1")


@pytest.mark.parametrize("call, says", [
    ("torch.neuron.set_device('neuron:1')", "expects a device index (int)"),
    ("torch.ones(1, device='neuron:7')", "Device index 7 is out of range. Valid range is 0 to 3"),
    ("torch.neuron.set_device(5)", "Invalid device id: 5"),
])
def test_a_refused_device_argument_is_reported_at_its_line(tmp_path, call, says):
    script = tmp_path / "program.py"
    script.write_text(f"import torch\nx = torch.ones(2, device='neuron')\n{call}\n")
    r = run(f"import runpy, sys; sys.argv = ['run', '--output-dir', {str(tmp_path / 'report')!r}, {str(script)!r}]; "
            "runpy.run_module('torch_neuronx.run', run_name='__main__')")
    assert says in r.stderr, r.stderr[-3000:]
    assert f"{script}:3  [device-argument]" in r.stderr, r.stderr[-3000:]
