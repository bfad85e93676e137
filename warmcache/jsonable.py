"""One way a result becomes JSON: its dataclass fields in declaration order, a few under another key.

A ``--json`` answer then names every field a result has without each one being written
twice (once as a field, once as a key), and a new field cannot be forgotten in it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any


def fields_json(
    result: Any, renamed: Mapping[str, str] | None = None, *, leave_out: Collection[str] = ()
) -> dict[str, Any]:
    """``result``'s fields (a dataclass instance) as JSON: keyed by name, or by ``renamed[name]``; ``leave_out``
    names fields that stay private."""
    keys = renamed or {}
    return {
        keys.get(f.name, f.name): json_value(getattr(result, f.name)) for f in fields(result) if f.name not in leave_out
    }


def json_value(value: Any) -> Any:
    """A nested result by its own ``as_json``, a tuple as a list, a path as text; anything else as it is."""
    if hasattr(value, "as_json"):
        return value.as_json()
    if isinstance(value, tuple):
        return [json_value(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


class FieldsJson:
    """For a result whose JSON is exactly its fields: ``as_json`` written once, here (subclasses are dataclasses)."""

    __slots__ = ()

    def as_json(self) -> dict[str, Any]:
        return fields_json(self)
