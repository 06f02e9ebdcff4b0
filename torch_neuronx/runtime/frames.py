"""Which frames of the stack are the user's: the one walker for every place that names the user's
line (readiness findings, the plan's collectives, its audit of rank values).

A frame is a library's when its file is torch's, torch_neuronx's or a frozen module's; callers that
name the program's own code skip the standard library too (``stdlib``), and any pseudo-file such as
``<string>`` (``pseudo``). The walk is by frame (``sys._getframe``), not traceback: it runs on hot
paths (every op that makes a finding, every collective).
"""
from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Iterator

import torch

TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
_LIBRARIES = (TORCH_DIR, PACKAGE_DIR, "<frozen")
_WITH_STDLIB = (*_LIBRARIES, STDLIB_DIR)
_WITH_PSEUDO_FILES = (TORCH_DIR, PACKAGE_DIR, STDLIB_DIR, "<")


def is_library(filename: str, stdlib: bool = False, pseudo: bool = False) -> bool:
    """Whether code in ``filename`` is a library's rather than the user's (see the module's rules)."""
    if pseudo:
        return filename.startswith(_WITH_PSEUDO_FILES)
    return filename.startswith(_WITH_STDLIB if stdlib else _LIBRARIES)


def outward(depth: int = 1) -> Iterator[FrameType]:
    """The frames from ``depth`` levels above the caller (1: the caller's caller) outward."""
    frame = sys._getframe(depth + 1)
    while frame is not None:
        yield frame
        frame = frame.f_back


def user_line(depth: int = 1) -> str | None:
    """'file.py:line' of the program's own innermost frame (no library, standard library or pseudo-file)."""
    for frame in outward(depth + 1):
        if not is_library(frame.f_code.co_filename, pseudo=True):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return None
