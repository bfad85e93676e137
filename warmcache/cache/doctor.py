"""``cache doctor``: find what keeps a cache from working and plan the repair.

It finds, for one cache root:

- stale locks (no live holder, older than the grace period): a crash left them,
  and the next compile of that graph waits on them;
- failed Neuron entries: the cache replays a failed compile forever;
- incomplete entries (older than the grace period): a compile killed midway;
- compiled/verified rows of this machine's toolchain whose artifacts are gone:
  the registry promises a warm shape the cache cannot serve. Those rows are
  forgotten, so the shapes read ``missing`` and the next warmup compiles them.
  Rows of other toolchains describe other machines' caches and are left to
  ``cache prune --stale-toolchains``. A row is this cache's when it was compiled
  into this folder (its ``cache_root``), or still keeps some entry here; a row of
  another folder or another host of a fleet registry is left alone unless
  ``any_host``. Rows recorded before warmcache kept the folder fall back to "compiled
  on this host";
- leftover ``.warmcache-*`` work folders of interrupted prunes and unpacks, and
  ``precompiled/`` and ``aotinductor/`` ``.<sha256>.partial`` files of interrupted artifact writes.

Removing an entry also forgets every row that references it.
"""

from __future__ import annotations

import socket
from pathlib import Path

from warmcache.cache.cleanup import CleanupPlan, Forget, Removal
from warmcache.cache.inventory import CacheEntry, CacheInfo, EntryUse
from warmcache.cache.layout import NEURON_MODULE
from warmcache.cache.neuron import DEFAULT_GRACE_SECONDS
from warmcache.units import format_age


def diagnose(info: CacheInfo, grace_seconds: float = DEFAULT_GRACE_SECONDS, *, any_host: bool = False) -> CleanupPlan:
    """The repair plan for ``info`` (nothing is changed here)."""
    if not info.exists:
        # A wrong --cache-dir must not read as "every artifact is gone" and forget every row.
        note = f"{info.root} does not exist; registry rows are left alone (is --cache-dir right?)"
        return CleanupPlan(info.root, info.location.flavor, (), (), (note,))
    removals: list[Removal] = []
    forgets: dict[int, Forget] = {}
    notes: list[str] = []
    for entry in info.entries:
        if entry.lock_held:
            notes.append(
                f"{entry.path}: locked, and a live process holds the lock or a Neuron compiler runs on "
                "this host; left alone"
            )
            continue
        fresh_locks = [lk for lk in entry.locks if not lk.is_stale(grace_seconds)]
        if fresh_locks:
            notes.append(
                f"{entry.path}: lock {fresh_locks[0].path} is only "
                f"{format_age(fresh_locks[0].age_seconds)} old; left alone"
            )
            continue
        reason = _entry_problem(entry, info.scanned_at - entry.last_used, grace_seconds)
        if reason is not None:
            removals.append(Removal(entry.path, entry.size_bytes, reason))
            _forget_users(forgets, entry.used_by, f"its cache entry {entry.path} is removed ({reason.split(':')[0]})")
            continue
        for lock in entry.locks:
            removals.append(
                Removal(
                    lock.path,
                    lock.size_bytes,
                    f"stale lock: no live holder, {format_age(lock.age_seconds)} old",
                    is_entry=False,
                )
            )
    here = socket.gethostname()
    holds_some = {u.row_id for e in info.entries for u in e.used_by}
    elsewhere: set[int] = set()
    for missing in info.missing:
        use = missing.used_by
        if not use.needed:
            continue
        if any_host or use.row_id in holds_some or _compiled_into(use, info.root, here):
            _forget_users(forgets, (use,), f"artifact {missing.path} is gone from the cache")
        else:
            elsewhere.add(use.row_id)
    if elsewhere:
        notes.append(
            f"{len(elsewhere)} compiled row(s) from other hosts or cache folders name only entries this cache lacks: "
            "left alone, they may describe another cache (--any-host forgets them)"
        )
    for work in info.work_dirs:
        if work.age_seconds >= grace_seconds:
            removals.append(
                Removal(
                    work.path,
                    work.size_bytes,
                    "leftover of an interrupted prune, unpack or artifact write",
                    is_entry=False,
                )
            )
    return CleanupPlan(info.root, info.location.flavor, tuple(removals), tuple(forgets.values()), tuple(notes))


def _entry_problem(entry: CacheEntry, idle_seconds: float, grace_seconds: float) -> str | None:
    if entry.kind != NEURON_MODULE:
        return None  # only the persistent Neuron cache's layout is documented well enough to judge an entry broken
    if entry.content_state == "failed":
        return "failed compile: the cache replays this failure instead of recompiling, forever"
    if entry.content_state == "incomplete" and idle_seconds >= grace_seconds:
        return f"incomplete: no finished NEFF, untouched for {format_age(idle_seconds)}"
    return None


def _forget_users(forgets: dict[int, Forget], users: tuple[EntryUse, ...], reason: str) -> None:
    for use in users:
        forgets.setdefault(use.row_id, Forget(use.row_id, use.describe(), reason))


def _compiled_into(use: EntryUse, root: Path, here: str) -> bool:
    """Whether a row was compiled into this cache folder (legacy rows: on this host)."""
    if use.cache_root is not None:
        return Path(use.cache_root).resolve() == root.resolve()
    return use.host == here
