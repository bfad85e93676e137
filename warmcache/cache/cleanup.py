"""Deleting from a compile cache without ever leaving the registry lying about it.

A :class:`CleanupPlan` is computed first (doctor, prune), shown as a dry run, and
only then executed. Execution order makes every interruption safe:

1. forget the registry rows that reference what will be deleted: from here on no
   row claims those entries, so they are merely orphans if we stop now;
2. move each path into a trash folder at the cache root (one atomic rename: an
   entry is either fully in place or fully gone, never half-deleted);
3. remove the trash folder. A crash leaves a ``.warmcache-trash-*`` folder, which
   scans ignore and ``cache doctor`` removes.

Just before forgetting, rows are read again: an entry that a row started to
reference after the scan (a warmup finishing concurrently) is kept.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache.cache.layout import TRASH_PREFIX
from warmcache.cache.locate import flavor_of_kind
from warmcache.jsonable import fields_json
from warmcache.registry import Registry


@dataclass(frozen=True, slots=True)
class Removal:
    """A path to delete, relative to the cache root: an entry, a lock file or a work folder."""

    path: str
    size_bytes: int
    reason: str
    #: Whether ``path`` is a cache entry (registry rows may reference it).
    is_entry: bool = True


@dataclass(frozen=True, slots=True)
class Forget:
    """A registry row to forget, so its shape reads ``missing`` again."""

    row_id: int
    description: str
    reason: str


@dataclass(frozen=True, slots=True)
class CleanupResult:
    removed: tuple[str, ...]
    kept: tuple[str, ...]
    forgotten: int
    freed_bytes: int

    def as_json(self) -> dict[str, Any]:
        return fields_json(self, {"forgotten": "forgotten_rows"})


@dataclass(frozen=True, slots=True)
class CleanupPlan:
    """What a cleanup would do; :meth:`execute` does it."""

    root: Path
    flavor: str
    removals: tuple[Removal, ...]
    forgets: tuple[Forget, ...]
    #: Things deliberately left alone, one line each (protected entries, live locks).
    notes: tuple[str, ...] = ()

    @property
    def freed_bytes(self) -> int:
        return sum(r.size_bytes for r in self.removals)

    @property
    def is_empty(self) -> bool:
        return not self.removals and not self.forgets

    def as_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "flavor": self.flavor,
            "freed_bytes": self.freed_bytes,
            "remove": [{"path": r.path, "size_bytes": r.size_bytes, "reason": r.reason} for r in self.removals],
            "forget": [{"row_id": f.row_id, "shape": f.description, "reason": f.reason} for f in self.forgets],
            "notes": list(self.notes),
        }

    def execute(self, registry: Registry | None) -> CleanupResult:
        """Forget rows, then delete paths (see the module docstring for why in this order)."""
        forget_ids = {f.row_id for f in self.forgets}
        removals = list(self.removals)
        kept: list[str] = []
        if registry is not None:
            newly_used = self._newly_referenced(registry, forget_ids)
            kept = [r.path for r in removals if r.path in newly_used]
            removals = [r for r in removals if r.path not in newly_used]
            registry.forget(sorted(forget_ids))
        elif forget_ids:
            raise ValueError("a plan that forgets rows needs the registry")
        trash = self.root / f"{TRASH_PREFIX}{uuid.uuid4().hex[:12]}"
        removed: list[str] = []
        freed = 0
        try:
            for index, removal in enumerate(removals):
                source = self.root / removal.path
                if not os.path.lexists(source):
                    continue
                trash.mkdir(exist_ok=True)
                os.rename(source, trash / str(index))
                removed.append(removal.path)
                freed += removal.size_bytes
        finally:
            shutil.rmtree(trash, ignore_errors=True)
        return CleanupResult(tuple(removed), tuple(kept), len(forget_ids), freed)

    def _newly_referenced(self, registry: Registry, forget_ids: set[int]) -> set[str]:
        """Entries to delete that a row outside the plan references now (it appeared after the scan)."""
        targets = {r.path for r in self.removals if r.is_entry}
        if not targets:
            return set()
        return {
            a.path
            for record in registry.rows(with_artifacts=True)
            if record.id not in forget_ids
            for a in record.artifacts
            if a.path in targets and flavor_of_kind(a.kind) == self.flavor
        }
