"""Which of a model's rows a guard serves: those of its filters, usable on this machine, one compiled family.

:class:`~warmcache.runtime.guard.ShapeGuard` calls :func:`select_family` on every
(re)load. It is kept apart from the guard's hot path (``decide``) because it is the
part that reads the rows: staleness, several families, several model configs, each
refused with one line that says what to choose.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from warmcache.errors import UsageError
from warmcache.identity.fingerprint import config_hash
from warmcache.registry.records import ShapeRecord
from warmcache.registry.usability import bucket_tables, stale_records, usable_records
from warmcache.shapes import BucketTable, ShapeFamily


class RowFilter(NamedTuple):
    """Which of a model's rows a guard serves from: each ``None`` keeps every value."""

    dtype: str | None
    max_cache_len: int | None
    backend: str | None

    def keeps(self, row: ShapeRecord) -> bool:
        return (
            (self.dtype is None or row.dtype == self.dtype)
            and (self.max_cache_len is None or row.max_cache_len == self.max_cache_len)
            and (self.backend is None or row.backend == self.backend)
        )


class Selected(NamedTuple):
    """The rows a guard serves, their one family and its bucket table."""

    rows: list[ShapeRecord]
    family: ShapeFamily
    table: BucketTable


def select_family(
    loaded: list[ShapeRecord],
    filters: RowFilter,
    *,
    config_hash: str | None,
    attn_implementation: str | None,
    source: str,
    wanted: str,
) -> Selected:
    """The usable rows of ``loaded`` that ``filters`` and the chosen model config keep, when they form one family.

    Raises :class:`UsageError` naming ``source`` when none is usable here (saying why
    when they are stale) or when several families or compile targets remain.
    """
    kept = [r for r in loaded if filters.keeps(r)]
    rows = [
        r
        for r in usable_records(kept)
        if (config_hash is None or r.config_hash == config_hash)
        and (attn_implementation is None or r.attn_implementation == attn_implementation)
    ]
    tables = bucket_tables(compiled_for_every_config(rows))
    if not tables:
        raise UsageError(
            f"{source}: no usable compiled {wanted} shapes for this machine's toolchain{_why_stale(kept, rows)} "
            "(see `warmcache explain`)"
        )
    targets = {(r.device, r.backend, r.mode) for r in rows}
    if len(tables) > 1 or len(targets) > 1:
        options = "; ".join(sorted({f"{r.family.describe()} {r.device}/{r.backend}/{r.mode}" for r in rows}))
        raise UsageError(
            f"{source}: {wanted} has several compiled families ({options}); choose one with "
            "dtype=, max_cache_len= or backend="
        )
    ((family, table),) = tables.items()
    return Selected(rows, family, table)


def model_config_filter(
    rows: list[ShapeRecord], config: dict[str, Any], attn_implementation: str | None, *, source: str, wanted: str
) -> tuple[str, str | None]:
    """The ``config_hash`` and attention implementation :func:`select_family` narrows ``rows`` to for a model of
    ``config`` (:meth:`ShapeGuard.check_model_config`): the implementation only where some row declared one.

    Raises :class:`UsageError` naming ``source`` and ``wanted`` when no row was compiled for this config, or when
    rows declare implementations and none is ``attn_implementation``.
    """
    digest = config_hash(config)
    known = sorted({r.config_hash for r in rows})
    if digest not in known:
        raise UsageError(
            f"{source}: {wanted}: config_hash {digest} matches no compiled rows "
            f"(compiled for config_hash {', '.join(known)})"
        )
    mine = [r for r in rows if r.config_hash == digest]
    declared = sorted({r.attn_implementation for r in mine if r.attn_implementation is not None})
    if declared and attn_implementation not in declared:
        from warmcache.registry.differences import UNSET  # the error path alone needs it

        raise UsageError(
            f"{source}: {wanted}: attn_implementation {attn_implementation or UNSET!r} matches no compiled rows "
            f"(compiled with attn_implementation {', '.join(repr(a) for a in declared)}); load it "
            f"with attn_implementation={declared[0]!r}"
        )
    return digest, attn_implementation if declared else None


def _why_stale(kept: list[ShapeRecord], rows: list[ShapeRecord]) -> str:
    """``; its compiled rows are stale here: ...`` when stale rows are all there is, else nothing."""
    # Imported here: the explanation is only needed on this error path, not at every guard's start.
    from warmcache.registry.differences import describe, stale_differences

    stale = stale_records(kept)
    return f"; its compiled rows are stale here: {describe(stale_differences(stale))}" if stale and not rows else ""


def compiled_for_every_config(rows: list[ShapeRecord]) -> list[ShapeRecord]:
    """While no model config is chosen (:meth:`ShapeGuard.check_model_config`), keep only
    the buckets compiled for every config among ``rows``: padding onto a bucket that only
    another checkpoint config compiled would compile in production."""
    by_config: dict[tuple[str, str | None], set[tuple[int, int]]] = {}
    for r in rows:
        by_config.setdefault((r.config_hash, r.attn_implementation), set()).add((r.batch_size, r.seq_len))
    if len(by_config) < 2:
        return rows
    common = set.intersection(*by_config.values())
    return [r for r in rows if (r.batch_size, r.seq_len) in common]
