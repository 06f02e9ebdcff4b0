"""Streams and events: CUDA's API and semantics, on a host-synchronous device."""
import gc
import time

import pytest
import torch

import torch_neuronx

from helpers.isolated import run


@pytest.fixture
def multi_stream(monkeypatch):
    """TorchNeuron's multi-stream mode: new streams are streams of their own."""
    monkeypatch.setenv("NEURON_RT_ENABLE_HOST_CC", "1")


def test_current_default_and_new_streams(multi_stream):
    default = torch.neuron.default_stream()
    assert isinstance(default, torch.neuron.Stream) and isinstance(default, torch.Stream)
    assert default.stream_id == 0 and default.device == torch.device("neuron:0")
    assert torch.neuron.current_stream() == default
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream(device=2, priority=-1)
    assert s1 != s2 and s1 != default and s2.device == torch.device("neuron:2") and s2.priority == -1
    assert torch.neuron.Stream.priority_range() == (0, -1)
    assert torch.accelerator.current_stream() == default


def test_single_stream_mode_by_default(monkeypatch):
    """As TorchNeuron: unless NEURON_RT_ENABLE_HOST_CC=1, a new stream is its device's default stream
    (torch.neuron.Stream(), torch.Stream, the pool torch's own code draws from); read at each creation."""
    monkeypatch.delenv("NEURON_RT_ENABLE_HOST_CC", raising=False)
    assert torch.neuron.Stream() == torch.neuron.default_stream() == torch_neuronx.default_stream()
    assert torch.neuron.Stream(device=2) == torch.neuron.default_stream(2)
    assert torch.Stream(device="neuron:1").stream_id == 0
    monkeypatch.setenv("NEURON_RT_ENABLE_HOST_CC", "1")
    assert torch.neuron.Stream() != torch.neuron.Stream()


def test_stream_context_sets_and_restores_stream_and_device():
    s = torch.neuron.Stream(device=1)
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream(1) == s and torch.neuron.current_device() == 1
        x = torch.ones(3, device="neuron") * 2  # ops run in program order, on the stream's device
        assert x.device.index == 1
    assert torch.neuron.current_device() == 0 and torch.neuron.current_stream(1).stream_id == 0
    with torch.neuron.stream(None):  # no-op, as on CUDA
        assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_set_stream_and_thread_locality():
    import threading
    s = torch.neuron.Stream()
    torch.neuron.set_stream(s)
    try:
        seen = []
        thread = threading.Thread(target=lambda: seen.append(torch.neuron.current_stream().stream_id))
        thread.start()
        thread.join()
        assert torch.neuron.current_stream() == s and seen == [0]  # current stream is per thread
    finally:
        torch.neuron.set_stream(torch.neuron.default_stream())
    with pytest.raises(TypeError, match="expects a neuron stream"):
        torch.neuron.set_stream(torch.Stream(device="cpu"))


def test_wait_stream_and_events_order_work(multi_stream):
    producer, consumer = torch.neuron.Stream(), torch.neuron.Stream()
    with torch.neuron.stream(producer):
        x = torch.arange(6.0, device="neuron").reshape(2, 3) * 3
        done = producer.record_event()
    assert isinstance(done, torch.neuron.Event) and done.query()
    other = torch.neuron.Stream(device=2).record_event()  # on another device than the current one
    assert other.device == torch.device("neuron:2")
    consumer.wait_event(done)
    consumer.wait_stream(producer)
    with torch.neuron.stream(consumer):
        y = x.sum()
    assert producer.query() and consumer.query()
    producer.synchronize()
    torch.neuron.synchronize()
    assert y.item() == 45.0


def test_event_timing():
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    time.sleep(0.05)
    x = torch.randn(64, 64, device="neuron") @ torch.randn(64, 64, device="neuron")
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    assert 45 <= elapsed < 5000 and x.shape == (64, 64)
    assert end.elapsed_time(start) < 0  # host timestamps: the order is the recording order


def test_event_errors_in_torchneurons_words():
    untimed = torch.neuron.Event()
    timed = torch.neuron.Event(enable_timing=True)
    with pytest.raises(RuntimeError, match="^Event was not created with timing enabled: .*enable_timing=True"):
        untimed.elapsed_time(timed)  # checked before recording, as TorchNeuron does
    untimed.record()
    with pytest.raises(RuntimeError, match="^Event has not been recorded: call record"):
        timed.elapsed_time(torch.neuron.Event(enable_timing=True))
    timed.record()
    with pytest.raises(RuntimeError, match="^End event was not created with timing enabled"):
        timed.elapsed_time(untimed)
    with pytest.raises(RuntimeError, match="^End event has not been recorded"):
        timed.elapsed_time(torch.neuron.Event(enable_timing=True))
    with pytest.raises(RuntimeError, match="not supported"):
        torch.neuron.Event(interprocess=True)
    assert torch.neuron.Event().query()  # never recorded: complete, as on CUDA


def test_generic_torch_stream_and_event_on_neuron():
    s = torch.Stream(device="neuron:1")
    e = torch.Event(device="neuron:1", enable_timing=True)
    e2 = torch.Event(device="neuron:1", enable_timing=True)
    e.record(s)
    e2.record(s)
    assert s.device_type == torch.neuron.current_stream().device_type and e.query()
    assert e.elapsed_time(e2) >= 0
    with s:
        assert torch.accelerator.current_stream(1) == s


def test_record_stream():
    x = torch.ones(4, device="neuron")
    x.record_stream(torch.neuron.Stream())
    with pytest.raises(RuntimeError, match="expected a neuron stream"):
        x.record_stream(torch.Stream(device="cpu"))


def test_fork_after_init_raises_and_points_to_spawn():
    r = run("""
        import os, torch
        torch.ones(1, device="neuron")
        pid = os.fork()
        if pid == 0:
            try:
                torch.ones(1, device="neuron")
                os._exit(3)
            except RuntimeError as error:
                os._exit(0 if "'spawn' start method" in str(error) else 4)
        print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "child 0"


def test_fork_before_init_is_fine():
    r = run("""
        import os, torch
        pid = os.fork()
        if pid == 0:
            os._exit(0 if torch.ones(2, device="neuron").sum().item() == 2 else 5)
        print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "child 0"


@pytest.mark.parametrize("record_stream", [False, True])
def test_diffusers_group_offloading_with_streams(record_stream):
    from diffusers.hooks import apply_group_offloading

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()) for _ in range(4)])
    x = torch.randn(2, 32)
    expected = model(x)
    apply_group_offloading(model, onload_device=torch.device("neuron"), offload_type="block_level",
                           num_blocks_per_group=1, use_stream=True, record_stream=record_stream)
    gc.collect()  # garbage of earlier tests in this worker must not be freed during the count
    before = torch.neuron.memory_allocated(0)
    out = model(x.to("neuron"))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)
    assert next(model.parameters()).device.type == "cpu"  # offloaded again after use
    del out
    assert torch.neuron.memory_allocated(0) == before  # onloaded weights were released
