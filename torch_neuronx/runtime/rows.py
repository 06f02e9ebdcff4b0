"""Typed rows of a result (the readiness report's, a plan's): each a dataclass (frozen unless it is
filled in as it is counted) whose ``to_dict`` is exactly its JSON object (its fields in order; an
optional field left out while it is None) and whose ``from_dict`` reads that object back, once,
where a written file is read."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar


def jsonable(value: Any) -> Any:
    """``value`` as the JSON holds it: rows as their dicts, inside lists, tuples and dicts too."""
    if isinstance(value, Row):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return type(value)(jsonable(v) for v in value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value


class Row:
    """A typed row: ``optional`` names the fields its JSON leaves out while None; ``nested`` says how
    :meth:`from_dict` reads a field that holds rows (a function of the JSON value)."""

    optional: ClassVar[tuple[str, ...]] = ()
    nested: ClassVar[dict[str, Callable[[Any], Any]]] = {}

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in self.optional:
                continue
            out[f.name] = jsonable(value)
        return out

    @classmethod
    def from_dict(cls, data: dict):
        """The row of ``data`` (its JSON object): a key it lacks takes the field's default (an optional
        field the JSON left out), or raises KeyError when the field has none; keys it does not know
        are not read."""
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise KeyError(f.name)
                continue
            value, read = data[f.name], cls.nested.get(f.name)
            values[f.name] = read(value) if read is not None and value is not None else value
        return cls(**values)


def rows_of(cls) -> Callable[[list], list]:
    """How ``from_dict`` reads a list of ``cls`` rows."""
    return lambda items: [cls.from_dict(item) for item in items]


def map_of(cls) -> Callable[[dict], dict]:
    """How ``from_dict`` reads a {name: ``cls`` row} map."""
    return lambda items: {name: cls.from_dict(item) for name, item in items.items()}
