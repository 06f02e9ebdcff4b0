"""A tool's result and its files (report.*, plan.*): the shape every result shares (:class:`Result`),
and :func:`write`, which writes each file complete or not at all."""
from __future__ import annotations

import json
import os
from typing import Callable, ClassVar, Protocol

FORMATS = ("txt", "json", "html")


class Result(Protocol):
    """What the readiness report, a structure plan and a numerics plan share: ``stem`` names their
    files (report.txt, plan.json, ...); ``to_dict`` is the JSON, ``text`` and ``html`` the others."""
    stem: ClassVar[str]

    def to_dict(self) -> dict: ...

    def text(self) -> str: ...

    def html(self) -> str: ...


def write(result: Result, directory: str, formats=FORMATS,
          more: dict[str, Callable[[], str]] | None = None) -> dict[str, str]:
    """Write ``result`` into ``directory`` as <stem>.<format> for each of ``formats`` (txt, json, html,
    and those ``more`` renders: format -> its text), each ending in a newline; the paths by format."""
    render = {"txt": result.text, "json": lambda: json.dumps(result.to_dict(), indent=1, default=str),
              "html": result.html, **(more or {})}
    unknown = [kind for kind in formats if kind not in render]
    if unknown:
        raise ValueError(f"unknown {result.stem} format {', '.join(unknown)}: use {', '.join(render)}")
    contents = {}
    for kind in formats:
        text = render[kind]()
        contents[f"{result.stem}.{kind}"] = text if text.endswith("\n") else text + "\n"
    written = write_files(directory, contents)
    return {name.rsplit(".", 1)[1]: path for name, path in written.items()}


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
