"""The manifest checker: walks the parsed TOML, one line per problem, never stopping at the first.

Each line names the file, the entry's name once it is known (``model 'tiny-llama'``), the
key path (``model[0].generate[1].batch_sizes[2]``) and the value at fault, with a
did-you-mean for a misspelt key or value.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmcache.bounds import MAX_COUNT, path_problem
from warmcache.errors import MAX_SHOWN_CHARS, shown


@dataclass
class Checker:
    """Walks the parsed TOML, collecting one line per problem."""

    file: Path
    problems: list[str] = field(default_factory=list)
    #: ``{entry key: what it is called}`` (``{"model[0]": "model 'tiny-llama'"}``): an index alone is hard to find in a
    #: long manifest.
    names: dict[str, str] = field(default_factory=dict)

    def problem(self, key: str, message: str) -> None:
        name = self.names.get(key.split(".", 1)[0])
        self.problems.append(f"{self.file}: {f'{name}: ' if name else ''}{key}: {message}")

    def name(self, where: str, called: str) -> None:
        """From now on, problems under ``where`` also say what the entry is ``called``."""
        self.names[where] = called

    def unknown_keys(self, table: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
        for key in table:
            if key not in allowed:
                close = close_match(key, allowed)
                hint = f" (did you mean {close!r}?)" if close else f" (allowed: {', '.join(allowed)})"
                self.problem(f"{where}{'.' if where else ''}{key_shown(key)}", f"unknown key{hint}")

    def table(self, parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
        value = parent.get(key, {})
        if not isinstance(value, dict):
            self.problem(where, f"must be a table, got {show(value)}")
            return {}
        return value

    def tables(self, parent: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
        value = parent.get(key, [])
        if isinstance(value, dict):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.problem(where, f"must be an array of tables ([[{key}]]), got {show(value)}")
            return []
        return value

    def _absent(self, table: dict[str, Any], key: str, where: str, required: bool) -> bool:
        """Whether ``key`` is missing from ``table`` (a problem when it is required): the caller then takes its
        default."""
        if key in table:
            return False
        if required:
            self.problem(f"{where}.{key}", "missing required key")
        return True

    def string(
        self, table: dict[str, Any], key: str, where: str, *, required: bool = False, default: str | None = None
    ) -> str | None:
        if self._absent(table, key, where, required):
            return default
        value = table[key]
        if not isinstance(value, str) or not value.strip():
            self.problem(f"{where}.{key}", f"must be a non-empty string, got {show(value)}")
            return default
        return value

    def choice(
        self,
        table: dict[str, Any],
        key: str,
        where: str,
        choices: tuple[str, ...],
        default: str | None,
        synonyms: Mapping[str, str] | None = None,
    ) -> str | None:
        """One of ``choices``; a wrong value's did-you-mean also knows ``synonyms`` (what people call a choice)."""
        value = self.string(table, key, where, default=default)
        if value is not None and value not in choices:
            close = close_match(value, choices, synonyms)
            hint = f"; did you mean {close!r}?" if close else ""
            self.problem(f"{where}.{key}", f"unknown value {shown(value)} (allowed: {', '.join(choices)}){hint}")
            return default
        return value

    def file_path(self, table: dict[str, Any], key: str, where: str, *, required: bool = False) -> str | None:
        """A string the file system can take as a path (checked now: later it would be an OSError)."""
        value = self.string(table, key, where, required=required)
        problem = path_problem(value) if value is not None else None
        if problem:
            self.problem(f"{where}.{key}", f"{shown(value)} {problem}")
            return None
        return value

    def boolean(self, table: dict[str, Any], key: str, where: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            self.problem(f"{where}.{key}", f"must be true or false, got {show(value)}")
            return default
        return value

    def positive_int(
        self, table: dict[str, Any], key: str, where: str, *, required: bool = False, default: int | None = None
    ) -> int | None:
        if self._absent(table, key, where, required):
            return default
        return self._positive(table[key], f"{where}.{key}", default)

    def _positive(self, value: Any, key: str, default: int | None) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(key, f"must be an integer, got {show(value)}")
            return default
        if value <= 0:
            self.problem(key, f"must be > 0, got {shown(value)}")
            return default
        if value > MAX_COUNT:
            self.problem(key, f"{shown(value)} is larger than the registry can hold ({MAX_COUNT})")
            return default
        return value

    def positive_ints(self, table: dict[str, Any], key: str, where: str) -> tuple[int, ...]:
        if self._absent(table, key, where, required=True):
            return ()
        value = table[key]
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list) or not value:
            self.problem(f"{where}.{key}", f"must be a non-empty list of integers, got {show(value)}")
            return ()
        good = [self._positive(v, f"{where}.{key}[{i}]", None) for i, v in enumerate(value)]
        return tuple(sorted({v for v in good if v is not None}))


def show(value: Any) -> str:
    return f"{shown(value)} ({type(value).__name__})"


def key_shown(key: str) -> str:
    return key if len(key) <= MAX_SHOWN_CHARS and key.isprintable() else shown(key)


def close_match(value: str, choices: tuple[str, ...], synonyms: Mapping[str, str] | None = None) -> str | None:
    """A did-you-mean: the choice ``value`` names in other case or by another name (``gpu`` is ``cuda``), else the
    nearest spelling; a value far longer than any choice is no typo (and difflib is slow on it).

    Spelling alone would answer ``gpu`` with ``cpu``, one letter away: the opposite of what was meant.
    """
    if len(value) > MAX_SHOWN_CHARS:
        return None
    folded = value.strip().lower()
    if folded in choices:
        return folded
    if synonyms and folded in synonyms:
        return synonyms[folded]
    close = difflib.get_close_matches(value, choices, n=1)
    return close[0] if close else None
