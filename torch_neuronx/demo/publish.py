"""Writing a saved pipeline so that no reader ever sees half of it: everything goes into a staging
directory beside the target, and one rename publishes it."""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable


def publish_once(directory: str, marker: str, write: Callable[[str], None]) -> str:
    """``directory`` with ``write(staging)``'s files in it, written once: a copy holding ``marker``
    is complete and is kept; a copy without it (an interrupted writer) is replaced."""
    if os.path.isfile(os.path.join(directory, marker)):
        return directory
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".staging-", dir=parent)
    try:
        write(staging)
        try:
            os.rename(staging, directory)
        except OSError:  # another process got there first, or a broken copy is in the way
            if not os.path.isfile(os.path.join(directory, marker)):
                shutil.rmtree(directory, ignore_errors=True)
                os.rename(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory
