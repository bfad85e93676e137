"""``cache prune``: free disk space without breaking a compiled shape.

Which entries are *eligible*:

- ``orphans`` / ``stale_toolchains`` choose them: entries no registry row
  references, and entries only rows of other toolchains reference (nothing on
  this machine can load those). Without either, every entry is eligible;
- ``older_than`` keeps only entries not used for that long (newest atime/mtime);
- ``max_size`` deletes eligible entries least recently used first, only as many
  as it takes for the cache to fit.

Never eligible: an entry a current ``compiled``/``verified`` row needs, unless
``include_referenced`` (those rows are then forgotten and read ``missing``); an
Inductor kernel file while any current row uses this cache (kernels are shared
between graphs and no row records every kernel it loads, see
``layout.SHARED_KINDS``), unless ``include_referenced``, which then forgets every
row of the cache; an entry under a live or recent lock (a compile in progress); an
orphan while a warmup holds a lock in this cache, or younger than the grace
period (a warmup writes its entries before it records them). Every row that
references a deleted entry is forgotten first (see :mod:`cleanup`).
"""

from __future__ import annotations

from dataclasses import dataclass

from warmcache.cache.cleanup import CleanupPlan, Forget, Removal
from warmcache.cache.inventory import CacheEntry, CacheInfo
from warmcache.cache.neuron import DEFAULT_GRACE_SECONDS
from warmcache.errors import UsageError
from warmcache.units import format_age, format_size


@dataclass(frozen=True, slots=True)
class PruneRules:
    """What the user asked to prune (see the module docstring)."""

    orphans: bool = False
    stale_toolchains: bool = False
    older_than_seconds: float | None = None
    max_size_bytes: int | None = None
    include_referenced: bool = False
    grace_seconds: float = DEFAULT_GRACE_SECONDS

    def check(self) -> None:
        if not (
            self.orphans
            or self.stale_toolchains
            or self.older_than_seconds is not None
            or self.max_size_bytes is not None
        ):
            raise UsageError(
                "cache prune: say what to prune: --orphans, --stale-toolchains, --older-than AGE and/or --max-size SIZE"
            )


def plan_prune(info: CacheInfo, rules: PruneRules) -> CleanupPlan:
    """The prune plan for ``info`` under ``rules`` (nothing is changed here)."""
    rules.check()
    eligible: list[tuple[CacheEntry, str]] = []
    kept: dict[str, list[CacheEntry]] = {}
    in_use = bool(info.needed_by)
    for entry in info.entries:
        reason = _selected(entry, rules, info.scanned_at)
        if reason is None:
            continue
        blocker = _blocker(entry, rules, info, in_use)
        if blocker is not None:
            kept.setdefault(blocker, []).append(entry)
        else:
            eligible.append((entry, reason))
    notes = [_kept_note(blocker, entries) for blocker, entries in kept.items()]
    if rules.max_size_bytes is not None:
        eligible = _least_recently_used_until_fits(eligible, info.size_on_disk, rules.max_size_bytes, notes)
    forgets: dict[int, Forget] = {}
    for entry, reason in eligible:
        for use in entry.used_by:
            forgets.setdefault(
                use.row_id, Forget(use.row_id, use.describe(), f"its cache entry {entry.path} is pruned ({reason})")
            )
        if entry.is_shared_kernel:
            for use in info.needed_by:
                forgets.setdefault(
                    use.row_id,
                    Forget(use.row_id, use.describe(), f"it may load kernel file {entry.path}, which is pruned"),
                )
    removals = tuple(Removal(e.path, e.size_bytes, reason) for e, reason in eligible)
    return CleanupPlan(info.root, info.location.flavor, removals, tuple(forgets.values()), tuple(notes))


def _kept_note(blocker: str, entries: list[CacheEntry]) -> str:
    """One line per reason, however many entries it keeps."""
    if len(entries) == 1:
        return f"{entries[0].path}: kept: {blocker}"
    return (
        f"{len(entries)} entries ({format_size(sum(e.size_bytes for e in entries))}) kept: "
        f"{blocker}; e.g. {entries[0].path}"
    )


def _selected(entry: CacheEntry, rules: PruneRules, now: float) -> str | None:
    """Why ``entry`` is chosen by the rules, or ``None``."""
    reasons = []
    if rules.orphans or rules.stale_toolchains:
        if rules.orphans and entry.is_orphan:
            reasons.append("orphan: no registry row references it")
        elif rules.stale_toolchains and entry.only_stale:
            reasons.append("only rows of other toolchains reference it")
        else:
            return None
    idle = now - entry.last_used
    if rules.older_than_seconds is not None:
        if idle < rules.older_than_seconds:
            return None
        reasons.append(f"unused for {format_age(idle)}")
    if not reasons:
        reasons.append(f"least recently used ({format_age(idle)} ago)")
    return "; ".join(reasons)


def _blocker(entry: CacheEntry, rules: PruneRules, info: CacheInfo, cache_in_use: bool) -> str | None:
    """Why an entry the rules chose must stay anyway, or ``None``."""
    if entry.lock_held or any(not lk.is_stale(rules.grace_seconds) for lk in entry.locks):
        return "locked (a compile may be in progress)"
    if entry.is_needed and not rules.include_referenced:
        return "needed by compiled shapes (--include-referenced deletes it anyway)"
    if entry.is_shared_kernel and cache_in_use and not rules.include_referenced:
        return (
            "a kernel file compiled shapes of this cache may load: kernels are shared between graphs "
            "(--include-referenced deletes it anyway)"
        )
    if entry.is_orphan and rules.orphans and info.orphans_unknown:
        return f"not known to be an orphan: {info.orphans_unknown} (name the folder with --cache-dir to prune it)"
    if entry.is_orphan and info.warmup_running:
        return "an orphan while a warmup compiles into this cache: it records entries when each shape finishes"
    if entry.is_orphan and info.scanned_at - entry.last_used < rules.grace_seconds:
        return "a new orphan: a running warmup may record it yet (--grace)"
    return None


def _least_recently_used_until_fits(
    eligible: list[tuple[CacheEntry, str]], total: int, limit: int, notes: list[str]
) -> list[tuple[CacheEntry, str]]:
    chosen = []
    for entry, reason in sorted(eligible, key=lambda item: (item[0].last_used, item[0].path)):
        if total <= limit:
            break
        chosen.append((entry, reason))
        total -= entry.size_bytes
    if total > limit:
        notes.append(
            f"cache stays at {format_size(total)}, above --max-size {format_size(limit)}: the rest is not eligible"
        )
    return chosen
