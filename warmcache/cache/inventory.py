"""An inventory of one compile cache, cross-referenced with the registry.

Modelled on huggingface_hub's cache manager: a scan returns frozen data
(:class:`CacheInfo` → :class:`CacheEntry`), and anything that deletes works from
a plan computed on that data (:mod:`warmcache.cache.cleanup`), so a dry run and
the real run decide exactly the same thing.

The registry's ``artifacts`` table names the entries each compiled shape needs
(path relative to the cache root). An entry no row names is an *orphan*; an
artifact a row names that the cache lacks is *missing* (that row's claim is false).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache.artifacts.format import AOTINDUCTOR_DIR, AOTINDUCTOR_LIBRARY_DIR, PARTIAL_SUFFIX, PRECOMPILED_DIR
from warmcache.cache.layout import (
    NEURON_MODULE,
    NEURON_NEFF,
    SHARED_KINDS,
    STAGING_PREFIX,
    TRASH_PREFIX,
    entry_size,
    list_entries,
)
from warmcache.cache.locate import CacheLocation, flavor_of_kind
from warmcache.cache.locks import warmup_running
from warmcache.cache.neuron import (
    EntryState,
    LockInfo,
    NeuronEntryFacts,
    inspect_module,
    inspect_native,
    neuron_compiler_running,
)
from warmcache.jsonable import FieldsJson, fields_json
from warmcache.registry import ShapeRecord
from warmcache.registry.statuses import DONE_STATUSES, Status
from warmcache.registry.usability import effective_status


@dataclass(frozen=True, slots=True)
class EntryUse:
    """A registry row that references a cache entry."""

    row_id: int
    identity: str
    model: str
    workload: str
    batch_size: int
    seq_len: int
    #: The row's effective status on this machine (``stale`` for another toolchain).
    status: str
    #: The host that compiled it.
    host: str | None = None
    #: The cache folder it was compiled into (``None`` for rows recorded before warmcache kept it).
    cache_root: str | None = None

    @classmethod
    def of(cls, record: ShapeRecord) -> EntryUse:
        return cls(
            record.id,
            record.identity,
            record.model_name,
            record.workload,
            record.batch_size,
            record.seq_len,
            effective_status(record),
            record.host,
            record.cache_root,
        )

    @property
    def needed(self) -> bool:
        """A current compiled/verified shape: deleting its entry would make production compile."""
        return self.status in DONE_STATUSES

    def describe(self) -> str:
        return f"{self.model} {self.workload} batch={self.batch_size} seq={self.seq_len} ({self.status})"

    def as_json(self) -> dict[str, Any]:
        return fields_json(self, leave_out={"cache_root"})


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cache entry (see :mod:`warmcache.cache.layout`) and what uses it."""

    path: str
    kind: str
    #: ``locked`` whenever a lock file is present; otherwise :attr:`content_state`.
    state: EntryState
    content_state: EntryState
    size_bytes: int
    #: Newest access or modification time of its files (epoch seconds): the LRU clock.
    last_used: float
    compiler_version: str | None
    flags: tuple[str, ...] | None
    locks: tuple[LockInfo, ...]
    used_by: tuple[EntryUse, ...]

    @property
    def is_orphan(self) -> bool:
        return not self.used_by

    @property
    def is_needed(self) -> bool:
        return any(u.needed for u in self.used_by)

    @property
    def only_stale(self) -> bool:
        """Used only by rows of other toolchains: nothing on this machine can load it."""
        return bool(self.used_by) and all(u.status == Status.STALE for u in self.used_by)

    @property
    def is_shared_kernel(self) -> bool:
        """A kernel file any compiled graph in this cache may load (see ``layout.SHARED_KINDS``)."""
        return self.kind in SHARED_KINDS

    @property
    def lock_held(self) -> bool:
        return any(lock.held for lock in self.locks)

    def as_json(self) -> dict[str, Any]:
        return {
            **fields_json(self, leave_out={"used_by"}),
            "orphan": self.is_orphan,
            "used_by": [u.as_json() for u in self.used_by],
        }


@dataclass(frozen=True, slots=True)
class MissingArtifact(FieldsJson):
    """An artifact a registry row names that the cache does not hold."""

    path: str
    kind: str
    used_by: EntryUse


@dataclass(frozen=True, slots=True)
class WorkDir:
    """A prune's trash, an unpack's staging folder or a precompiled artifact's ``.partial`` file (a crash leaves
    them)."""

    path: str
    size_bytes: int
    age_seconds: float


@dataclass(frozen=True, slots=True)
class CacheInfo:
    """The result of :func:`scan_cache`."""

    location: CacheLocation
    exists: bool
    entries: tuple[CacheEntry, ...]
    missing: tuple[MissingArtifact, ...]
    work_dirs: tuple[WorkDir, ...]
    scanned_at: float
    #: A warmup holds a per-spec lock in this cache: its new entries are not recorded yet.
    warmup_running: bool = False
    #: Whether the entries were looked up in a registry (a scan with none names no orphans).
    cross_referenced: bool = True

    @property
    def root(self) -> Path:
        return self.location.root

    @property
    def size_on_disk(self) -> int:
        return sum(e.size_bytes for e in self.entries)

    @property
    def orphans_unknown(self) -> str | None:
        """Why no entry of this cache may be called an orphan (no registry, or a folder every process shares), or
        ``None``."""
        if self.location.shared:
            return f"{self.root} is the compiler's default folder, shared by every process of this user"
        if not self.cross_referenced:
            return "no registry to look the entries up in"
        return None

    @property
    def orphans(self) -> tuple[CacheEntry, ...]:
        return () if self.orphans_unknown else tuple(e for e in self.entries if e.is_orphan)

    @property
    def needed_by(self) -> tuple[EntryUse, ...]:
        """Every current compiled/verified row with an entry in this cache, once each."""
        uses = {u.row_id: u for e in self.entries for u in e.used_by if u.needed}
        return tuple(uses[k] for k in sorted(uses))

    def as_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "flavor": self.location.flavor,
            "source": self.location.source,
            "exists": self.exists,
            "size_bytes": self.size_on_disk,
            "entry_count": len(self.entries),
            "orphan_count": len(self.orphans),
            "orphans_unknown": self.orphans_unknown,
            "warmup_running": self.warmup_running,
            "entries": [e.as_json() for e in self.entries],
            "missing": [m.as_json() for m in self.missing],
            "work_dirs": [
                {"path": w.path, "size_bytes": w.size_bytes, "age_seconds": round(w.age_seconds, 1)}
                for w in self.work_dirs
            ],
        }


def scan_cache(
    location: CacheLocation,
    records: Sequence[ShapeRecord] | None = (),
    now: float | None = None,
) -> CacheInfo:
    """Inventory ``location``; ``records`` (read ``with_artifacts=True``) supply the cross-reference (``None``: there is
    no registry, so no entry is an orphan)."""
    cross_referenced = records is not None
    records = records or ()
    now = time.time() if now is None else now
    root = location.root
    users: dict[str, list[EntryUse]] = {}
    wanted: list[tuple[str, str, EntryUse]] = []
    for record in records:
        use = EntryUse.of(record)
        for artifact in record.artifacts:
            if flavor_of_kind(artifact.kind) == location.flavor:
                users.setdefault(artifact.path, []).append(use)
                wanted.append((artifact.path, artifact.kind, use))
    found = list_entries(root, location.flavor)
    compiler_running = location.flavor != "inductor" and bool(found) and neuron_compiler_running()
    entries = tuple(
        _entry(root, path, kind, tuple(users.get(path, ())), now, compiler_running)
        for path, kind in sorted(found.items())
    )
    missing = tuple(MissingArtifact(path, kind, use) for path, kind, use in wanted if path not in found)
    return CacheInfo(
        location, root.is_dir(), entries, missing, _work_dirs(root, now), now, warmup_running(root), cross_referenced
    )


def _entry(
    root: Path, path: str, kind: str, used_by: tuple[EntryUse, ...], now: float, compiler_running: bool
) -> CacheEntry:
    facts = _facts(root, path, kind, now, compiler_running)
    state: EntryState = "locked" if facts.locks else facts.content_state
    return CacheEntry(
        path=path,
        kind=kind,
        state=state,
        content_state=facts.content_state,
        size_bytes=entry_size(root, path),
        last_used=last_used(root / path),
        compiler_version=facts.compiler_version,
        flags=facts.flags,
        locks=facts.locks,
        used_by=used_by,
    )


def _facts(root: Path, path: str, kind: str, now: float, compiler_running: bool) -> NeuronEntryFacts:
    if kind == NEURON_MODULE:
        return inspect_module(root, path, now, compiler_running)
    if kind == NEURON_NEFF:
        return inspect_native(root, path, now, compiler_running)
    # Inductor writes each entry atomically (temp file, then rename): present means complete.
    return NeuronEntryFacts("done", None, None, ())


def last_used(path: Path) -> float:
    """Newest atime/mtime among ``path``'s files (``relatime`` keeps atime roughly current).

    A file that vanishes while it is read (a compiler's temp file renamed into place,
    another prune) is skipped; an entry with nothing left to read counts as used now,
    since something is changing it this very moment and no age rule should pick it.
    """
    candidates = list(_files(path)) if path.is_dir() else []
    stats = [s for s in map(_lstat_or_none, candidates) if s is not None] or [
        s for s in (_lstat_or_none(path),) if s is not None
    ]
    return max((max(s.st_atime, s.st_mtime) for s in stats), default=time.time())


def _lstat_or_none(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except FileNotFoundError:
        return None


def _files(folder: Path) -> Iterable[Path]:
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            yield Path(dirpath, name)


def _work_dirs(root: Path, now: float) -> tuple[WorkDir, ...]:
    """Trash and staging folders left in the cache; one that a concurrent prune or unpack removes mid-scan is
    skipped."""
    if not root.is_dir():
        return ()
    out = []
    for child in sorted(root.iterdir()):
        if not child.name.startswith((TRASH_PREFIX, STAGING_PREFIX)) or (folder := _lstat_or_none(child)) is None:
            continue
        files = _files(child) if stat.S_ISDIR(folder.st_mode) else (child,)
        size = sum(s.st_size for s in map(_lstat_or_none, files) if s is not None)
        out.append(WorkDir(child.name, size, max(0.0, now - folder.st_mtime)))
    return tuple(out) + _partial_artifacts(root, now)


def _partial_artifacts(root: Path, now: float) -> tuple[WorkDir, ...]:
    """Artifacts a writer never renamed into place (a full disk, a kill): ``precompiled/.<sha256>.partial`` and
    ``aotinductor/.<sha256>.partial``, ``aotinductor-lib/.<sha256>.partial`` (all written by
    :func:`~warmcache.artifacts.format.write_artifact`)."""
    found = (
        (f"{name}/{child.name}", _lstat_or_none(child))
        for name in (PRECOMPILED_DIR, AOTINDUCTOR_DIR, AOTINDUCTOR_LIBRARY_DIR)
        if (root / name).is_dir()
        for child in sorted((root / name).iterdir())
        if child.name.endswith(PARTIAL_SUFFIX)
    )
    return tuple(WorkDir(path, info.st_size, max(0.0, now - info.st_mtime)) for path, info in found if info is not None)
