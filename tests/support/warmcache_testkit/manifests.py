"""Manifest text for tests, from one helper: each test names only what its models differ in.

Most tests need "a model or two with a few shapes". Writing that out as TOML in
every file repeated the same dozen lines with small changes, and hid the one line
that mattered to the test. ``manifest_toml(model(...), ...)`` writes the TOML that
``warmcache.manifest`` parses; ``"{qwen3}"``/``"{llama}"`` paths are filled in by
conftest's ``write_manifest``. Tests of the manifest *parser* keep their literal
TOML: there the text itself is under test.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

Table = dict[str, Any]


def generate(
    batch_sizes: Sequence[int] = (1,), prompt_lengths: Sequence[int] = (8,), max_cache_len: int = 16, **keys: Any
) -> Table:
    """One ``[[model.generate]]`` family; the defaults are the smallest shape that decodes."""
    return {
        "batch_sizes": list(batch_sizes),
        "prompt_lengths": list(prompt_lengths),
        "max_cache_len": max_cache_len,
        **keys,
    }


def train(batch_sizes: Sequence[int] = (2,), seq_lengths: Sequence[int] = (8,), **keys: Any) -> Table:
    """One ``[[model.train]]`` family."""
    return {"batch_sizes": list(batch_sizes), "seq_lengths": list(seq_lengths), **keys}


def model(
    name: str, path: str = "{qwen3}", *, generate: Sequence[Table] = (), train: Sequence[Table] = (), **keys: Any
) -> Table:
    """One ``[[model]]``: ``keys`` are its own settings (backend, device, dtype, distributed, precompile...)."""
    return {"name": name, "path": path, **keys, "generate": list(generate), "train": list(train)}


def manifest_toml(*models: Table, **tables: Mapping[str, Any]) -> str:
    """The manifest's TOML: top-level ``tables`` (``registry={"url": ...}``, ``cache={"dir": ...}``), then the
    models."""
    lines: list[str] = []
    for table, settings in tables.items():
        lines += [f"[{table}]", *_assignments(settings), ""]
    for declared in models:
        families = {"generate": declared["generate"], "train": declared["train"]}
        lines += ["[[model]]", *_assignments({k: v for k, v in declared.items() if k not in families})]
        for workload, declared_families in families.items():
            for family in declared_families:
                lines += [f"[[model.{workload}]]", *_assignments(family)]
        lines.append("")
    return "\n".join(lines)


def _assignments(settings: Mapping[str, Any]) -> list[str]:
    return [f"{key} = {_value(value)}" for key, value in settings.items()]


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{key} = {_value(item)}" for key, item in value.items()) + " }"
    if isinstance(value, Sequence):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    raise TypeError(f"no TOML for {value!r}")
