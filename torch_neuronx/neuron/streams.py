"""Streams and events of the neuron device, shaped like ``torch.cuda``'s.

Execution is host-synchronous: an op has finished when it returns. A stream is
therefore an ordering label (each thread has a current stream per device, as on
CUDA), waiting on a stream or an event never blocks, ``query()`` is always True,
and an event records the host time at ``record()``, so ``elapsed_time`` is the
host time between two records. Code written for asynchronous streams (FSDP2,
diffusers' group offloading) runs unchanged and in program order.
"""
from __future__ import annotations

import torch

from torch_neuronx.neuron._device import _get_device_index, current_device
from torch_neuronx.neuron._device import device as _device_scope
from torch_neuronx.runtime import BACKEND_NAME
from torch_neuronx.runtime import ops as _ops

__all__ = ["Event", "Stream", "StreamContext", "current_stream", "default_stream", "set_stream", "stream"]

# Priorities mean nothing when nothing queues; the range follows CUDA's convention
# (lower is higher priority) so code passing priority=-1 keeps working.
_PRIORITY_RANGE = (0, -1)


class Stream(torch.Stream):
    """A neuron stream: ``torch.neuron.Stream(device=None, priority=0)``."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if kwargs:  # Stream(stream_id=..., device_index=..., device_type=...): wrap an existing stream
            return super().__new__(cls, priority=priority, **kwargs)
        index = _get_device_index(device, optional=True, use="attached")
        low, high = _PRIORITY_RANGE
        priority = min(max(int(priority), high), low)
        self = super().__new__(cls, device=torch.device(BACKEND_NAME, index), priority=priority)
        self._priority = priority
        return self

    def __init__(self, device=None, priority: int = 0, **kwargs):
        pass  # all done in __new__ (torch.Stream is immutable)

    @property
    def priority(self) -> int:
        return getattr(self, "_priority", 0)

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(lowest, highest) priority, as ``torch.cuda.Stream.priority_range``."""
        return _PRIORITY_RANGE

    def record_event(self, event: "Event | None" = None) -> "Event":
        """Record ``event`` (a new one if None) on this stream and return it."""
        if event is None:
            with _device_scope(self.device_index):  # an event belongs to the device current at creation
                event = Event()
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device={self.device} stream_id={self.stream_id}>"


def _wrap(stream: torch.Stream) -> Stream:
    return Stream(stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type)


class Event(torch.Event):
    """A neuron event: ``torch.neuron.Event(enable_timing=False, blocking=False, interprocess=False)``.

    It belongs to the current device. ``record()`` takes the host time; the work
    before it has completed, so ``query()`` is True and ``synchronize()``/``wait()`` return at once.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise RuntimeError(
                "torch.neuron.Event(interprocess=True) is not supported: the emulated device's events "
                "live in one host process. Share results between processes with torch.distributed.")
        self = super().__new__(cls, device=torch.device(BACKEND_NAME, current_device()),
                               enable_timing=enable_timing, blocking=blocking)
        self._enable_timing = bool(enable_timing)
        return self

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        pass

    def record(self, stream: Stream | None = None) -> None:
        """Record on ``stream`` (default: the current stream of the event's device)."""
        super().record(current_stream(self.device) if stream is None else stream)

    def wait(self, stream: Stream | None = None) -> None:
        """Make ``stream`` (default: current) wait for this event: immediate, the work is done."""
        super().wait(current_stream(self.device) if stream is None else stream)

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds of host time from this event's record() to ``end_event``'s."""
        if not isinstance(end_event, torch.Event) or end_event.device.type != BACKEND_NAME:
            raise TypeError(f"elapsed_time expects a neuron event, got {end_event!r}")
        fix = ": create both events with torch.neuron.Event(enable_timing=True)."
        if not getattr(self, "_enable_timing", True):  # known before record(): the core's event exists after
            raise RuntimeError("Event was not created with timing enabled" + fix)
        if not getattr(end_event, "_enable_timing", True):
            raise RuntimeError("End event was not created with timing enabled" + fix)
        return float(_ops._event_elapsed_ms(self.event_id, end_event.event_id))

    def __repr__(self) -> str:
        return f"<torch.neuron.Event device={self.device}>"


def current_stream(device=None) -> Stream:
    """The current stream of ``device`` (default: current device) on this thread."""
    return _wrap(torch._C._accelerator_getStream(_get_device_index(device, optional=True, use="attached")))


def default_stream(device=None) -> Stream:
    """The default stream of ``device`` (stream id 0)."""
    current = current_stream(device)
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: Stream | None) -> None:
    """Make ``stream`` current on its device (and its device current), as ``torch.cuda.set_stream``."""
    if stream is None:
        return
    if not isinstance(stream, torch.Stream) or stream.device.type != BACKEND_NAME:
        raise TypeError(f"torch.neuron.set_stream expects a neuron stream, got {stream!r}")
    torch._C._accelerator_setStream(stream)


class StreamContext:
    """Context manager that makes ``stream`` current (and its device), restoring both on exit."""

    def __init__(self, stream: Stream | None):
        self.stream = stream
        self._previous_device = -1
        self._previous_stream: Stream | None = None

    def __enter__(self):
        if self.stream is None:
            return self.stream
        if self.stream.device.type != BACKEND_NAME:
            raise TypeError(f"torch.neuron.stream expects a neuron stream, got {self.stream!r}")
        self._previous_device = current_device()
        self._previous_stream = current_stream(self.stream.device_index)
        set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc) -> bool:
        if self.stream is not None and self._previous_stream is not None:
            set_stream(self._previous_stream)
            _ops._set_device(self._previous_device)
        return False


def stream(stream: Stream | None) -> StreamContext:
    """``with torch.neuron.stream(s):`` runs the block with ``s`` as the current stream."""
    return StreamContext(stream)
