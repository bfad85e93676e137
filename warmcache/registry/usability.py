"""Which rows are usable on this machine: the rule every reader of the registry applies.

A row is usable here only if its toolchain fingerprint equals the one this machine
would compile with; a done row of any other toolchain reads as ``stale``. The
runtime guard, the cache inventory, the query commands and the service all ask it
here, so none of them depends on another's way of showing the answer.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from warmcache.identity.fingerprint import current_toolchain
from warmcache.registry.records import ShapeRecord
from warmcache.registry.statuses import DONE_STATUSES, Status
from warmcache.shapes import BucketTable, ShapeFamily


@functools.cache
def local_toolchain_hash(device: str, backend: str, mode: str) -> str:
    """This machine's toolchain hash for a compile target (computed once per target and process)."""
    return current_toolchain(device, backend, mode).hash


def effective_status(record: ShapeRecord) -> str:
    """The row's status, or ``stale`` when this machine's toolchain differs from the row's."""
    if record.toolchain_hash != local_toolchain_hash(record.device, record.backend, record.mode):
        return Status.STALE
    return record.status


def stale_records(records: Sequence[ShapeRecord]) -> list[ShapeRecord]:
    """Rows compiled (or verified) for another toolchain: what ``warmcache explain`` compares against this one."""
    return [r for r in records if r.status in DONE_STATUSES and effective_status(r) == Status.STALE]


def usable_records(records: Sequence[ShapeRecord]) -> list[ShapeRecord]:
    """Rows compiled (or verified) for this machine's toolchain."""
    return [r for r in records if r.status in DONE_STATUSES and effective_status(r) != Status.STALE]


def bucket_tables(records: Sequence[ShapeRecord]) -> dict[ShapeFamily, BucketTable]:
    """The rows' compiled ``(batch, seq)`` buckets, one table per shape family."""
    pairs: dict[ShapeFamily, set[tuple[int, int]]] = {}
    for record in records:
        pairs.setdefault(record.family, set()).add((record.batch_size, record.seq_len))
    return {family: BucketTable.from_pairs(p) for family, p in pairs.items()}
