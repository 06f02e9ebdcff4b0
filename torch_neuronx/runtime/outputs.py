"""Writing a tool's result files (report.*, plan.*): each complete or not at all."""
from __future__ import annotations

import os


def write_files(directory: str, contents: dict[str, str]) -> dict[str, str]:
    """Write {file name: text} into ``directory``, each through a temporary file renamed into
    place, so a reader never sees half a file and a failed write keeps the last one; the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for name, text in contents.items():
        path = paths[name] = os.path.join(directory, name)
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return paths
