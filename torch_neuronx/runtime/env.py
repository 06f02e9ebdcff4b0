"""Environment variables: one parser for booleans and one for numbers, so every variable
accepts the same words and a typo is never silently read as its default."""
from __future__ import annotations

import os

from torch_neuronx.runtime.warn import warn_once

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def env_flag(name: str, default: bool) -> bool:
    """The boolean in environment variable ``name``: 1/true/yes/on or 0/false/no/off, in any case;
    unset or empty means ``default``. Anything else raises ValueError naming the variable."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean: use 1, true, yes or on to turn it on; 0, false, no or "
                     f"off to turn it off; or unset it for the default ({'on' if default else 'off'})")


def env_number(name: str, default, kind=int):
    """The number >= 0 in environment variable ``name`` (``kind`` int or float), or ``default`` when
    unset. A bad value warns once, naming the variable, and the default is used: these only tune
    the compile cache, which must never stop a program."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
        if value >= 0:
            return value
    except ValueError:
        pass
    warn_once(("env", name, raw), f"torch_neuronx: ignoring {name}={raw!r} (expected a number >= 0); using "
                                  f"{default}")
    return default
