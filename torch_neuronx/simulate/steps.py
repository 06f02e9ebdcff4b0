"""The program's steps, marked for the plan's time: ``with torch_neuronx.simulate.step("decode", tokens=1):``.

A step is what the program does between entering and leaving the block: one training step, one
prefill, one generated token. The plan gives each step's time, and per token or per sequence when
the step says how many it processes. Outside the simulator the block does nothing (one attribute
read), so the marks stay in the program that runs on Trainium.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from torch_neuronx.runtime.rows import Row

# The recorder of the rank being simulated, while it records (simulate/recorder.py sets it): it
# takes the steps, and the calls of compiled graphs (simulate/compiled.py).
recording = None


@dataclass
class StepCount(Row):
    """A step name's calls in a rank's record (RankRecord.steps), and what each processes."""

    count: int
    tokens: int | None
    sequences: int | None


def _count(value, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"torch_neuronx.simulate.step({what}={value!r}): give a positive integer, the number of "
                         f"{what} this step processes, or leave it out")
    return value


@contextlib.contextmanager
def step(name: str = "step", *, tokens: int | None = None, sequences: int | None = None):
    """Mark one step of the program: the plan times each step and groups steps by ``name``.

    ``tokens`` (a decode step: 1; a prefill: the prompt's length) or ``sequences`` (a training step:
    the global batch) turn the step's time into time per token or per sequence. Steps do not nest."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"torch_neuronx.simulate.step(name={name!r}): give the step's name, e.g. 'decode'")
    tokens, sequences = _count(tokens, "tokens"), _count(sequences, "sequences")
    sink = recording
    if sink is None:
        yield
        return
    sink.begin_step(name, tokens, sequences)
    try:
        yield
    finally:
        sink.end_step()
