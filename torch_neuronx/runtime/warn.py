"""Warnings given once per process, whatever object raised them."""
from __future__ import annotations

import threading
import warnings
from typing import Hashable

_given: set = set()
_lock = threading.Lock()


def warn_once(key: Hashable, message: str, category: type[Warning] = RuntimeWarning, stacklevel: int = 3) -> bool:
    """Warn with ``message`` unless a warning with ``key`` was given already; returns whether it warned."""
    with _lock:
        if key in _given:
            return False
        _given.add(key)
    warnings.warn(message, category, stacklevel=stacklevel)
    return True
