"""Registry rows in a bundle: written as JSON, merged back idempotently by identity.

The identity (shape × model config × toolchain) is the key, so unpacking the same
bundle twice, or two bundles that share shapes, changes nothing the second time.
A local row that already says ``compiled``/``verified`` is kept (its missing
artifacts are added); a ``pending`` or ``failed`` one takes the bundle's result;
one a live worker is compiling right now is left to that worker.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from warmcache.bounds import MAX_BYTES, MAX_COUNT
from warmcache.errors import CacheError, shown
from warmcache.jsonable import FieldsJson
from warmcache.registry import Registry, ShapeRecord
from warmcache.registry.models import Artifact, CompiledShape, utcnow
from warmcache.registry.records import ADDED_COLUMNS, COLUMNS
from warmcache.registry.statuses import DONE_STATUSES, Status
from warmcache.targets import DEVICES

#: Row fields a bundle carries; who claimed it, lease times, its error and cache folder belong to the build machine
#: only.
_LOCAL_ONLY = frozenset({"id", "claimed_by", "lease_expires_at", "cache_root", "error"})
_FIELDS = tuple(name for name in COLUMNS if name not in _LOCAL_ONLY)
_TIMES = tuple(name for name in _FIELDS if COLUMNS[name][0] is dt.datetime)
_RESULT_FIELDS = ("status", "host", "compile_seconds", "graphs_compiled", "compiled_at", "verified_at")


@dataclass(frozen=True, slots=True)
class MergeResult(FieldsJson):
    inserted: int
    updated: int
    unchanged: int
    skipped: tuple[str, ...]

    def describe(self) -> str:
        """The merge's counts as ``bundle unpack`` and ``pull`` both print them."""
        return f"rows: {self.inserted} added, {self.updated} updated, {self.unchanged} unchanged"


def row_to_json(record: ShapeRecord) -> dict[str, Any]:
    data = record.as_json()
    out = {name: data[name] for name in _FIELDS}
    out["artifacts"] = data["artifacts"]
    return out


#: The JSON type(s) each bundled field must have, so that a malformed bundle is refused with
#: a message naming the field before anything is written, never a traceback (or a database
#: error) halfway through installing its entries; the flag marks a nullable field.
_STR, _INT, _DICT = (str,), (int,), (dict,)
#: The JSON type(s) a column of each Python type arrives as (timestamps as ISO text).
_JSON_TYPES: dict[type, tuple[type, ...]] = {str: _STR, int: _INT, float: (int, float), dict: _DICT, dt.datetime: _STR}
_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    name: (_JSON_TYPES[COLUMNS[name][0]], COLUMNS[name][1]) for name in _FIELDS
}
_ARTIFACT_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "kind": (_STR, False),
    "path": (_STR, False),
    "size_bytes": (_INT, True),
}
#: What installing reads of a row's toolchain: the platform its compiled code is for (platform_mark.claim_for_rows).
_TOOLCHAIN_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {"platform": (_STR, False)}
#: What each integer column holds (``Integer`` is 32-bit on PostgreSQL): checked before the
#: first write, or the driver's OverflowError would surface halfway through an install.
_INT_LIMITS = {"size_bytes": MAX_BYTES}


def check_rows(rows: Any, where: str) -> list[dict[str, Any]]:
    """Validate bundled rows completely (types, timestamps) so a bad bundle fails before anything is written."""
    if not isinstance(rows, list):
        raise CacheError(f"{where}: 'rows' must be a list")
    for index, row in enumerate(rows):
        at = f"{where}: rows[{index}]"
        if not isinstance(row, dict):
            raise CacheError(f"{at} must be an object")
        for name, default in ADDED_COLUMNS.items():  # a bundle packed before the column existed
            row.setdefault(name, default)
        missing = [name for name in (*_FIELDS, "artifacts") if name not in row]
        if missing:
            raise CacheError(f"{at} lacks {', '.join(missing)}")
        _check_types(row, _TYPES, at)
        _check_types(row["toolchain"], _TOOLCHAIN_TYPES, f"{at}.toolchain")
        if row["device"] not in DEVICES:  # installing asks the device's target what its code is for
            raise CacheError(
                f"{at}.device is {shown(row['device'])}, which no target compiles for ({', '.join(DEVICES)})"
            )
        if row["status"] not in DONE_STATUSES:
            raise CacheError(f"{at}.status is {shown(row['status'])}; a bundle carries only compiled or verified rows")
        if not isinstance(row["artifacts"], list) or not all(
            isinstance(a, dict) and {"kind", "path"} <= a.keys() for a in row["artifacts"]
        ):
            raise CacheError(f"{at}.artifacts must be a list of {{kind, path, size_bytes}} objects")
        for number, artifact in enumerate(row["artifacts"]):
            _check_types(artifact, _ARTIFACT_TYPES, f"{at}.artifacts[{number}]")
        _values(row, at)  # parses the timestamps
    return rows


def _check_types(data: dict[str, Any], types: dict[str, tuple[tuple[type, ...], bool]], at: str) -> None:
    for name, (allowed, nullable) in types.items():
        value = data.get(name)
        if value is None and nullable:
            continue
        if isinstance(value, bool) or not isinstance(value, allowed):  # JSON true is not a count
            wanted = " or ".join(
                {str: "a string", int: "an integer", float: "a number", dict: "an object"}[t] for t in allowed
            )
            raise CacheError(f"{at}.{name} is {shown(value)}, not {wanted}{' or null' if nullable else ''}; refused")
        if isinstance(value, int) and not 0 <= value <= _INT_LIMITS.get(name, MAX_COUNT):
            raise CacheError(
                f"{at}.{name} is {shown(value)}, outside what the registry holds (0 to "
                f"{_INT_LIMITS.get(name, MAX_COUNT)}); refused"
            )


def merge_rows(registry: Registry, rows: Sequence[dict[str, Any]], cache_root: str | None = None) -> MergeResult:
    """Insert or complete each bundled row in one transaction (all or nothing).

    Rows that take the bundle's result now live in ``cache_root`` (the unpack target),
    not in the build machine's folder.
    """
    inserted = updated = unchanged = 0
    skipped: list[str] = []
    now = utcnow()
    with registry.session() as session:
        existing = {
            row.identity: row
            for row in session.scalars(
                select(CompiledShape)
                .where(CompiledShape.identity.in_([r["identity"] for r in rows]))
                .options(selectinload(CompiledShape.artifacts))
            )
        }
        for data in rows:
            values = {**_values(data), "cache_root": cache_root}
            artifacts = {(a["kind"], a["path"]): a.get("size_bytes") for a in data["artifacts"]}
            row = existing.get(data["identity"])
            if row is None:
                row = CompiledShape(**values)
                row.artifacts = [Artifact(kind=k, path=p, size_bytes=s) for (k, p), s in sorted(artifacts.items())]
                session.add(row)
                existing[row.identity] = row
                inserted += 1
            elif row.status in DONE_STATUSES:
                have = {(a.kind, a.path) for a in row.artifacts}
                extra = [
                    Artifact(kind=k, path=p, size_bytes=s)
                    for (k, p), s in sorted(artifacts.items())
                    if (k, p) not in have
                ]
                row.artifacts.extend(extra)
                updated, unchanged = (updated + 1, unchanged) if extra else (updated, unchanged + 1)
            elif row.status == Status.COMPILING and row.lease_expires_at is not None and row.lease_expires_at > now:
                skipped.append(
                    f"{row.model_name} {row.workload} batch={row.batch_size} seq={row.seq_len}: "
                    f"{row.claimed_by} is compiling it now"
                )
            else:
                for name in (*_RESULT_FIELDS, "cache_root"):
                    setattr(row, name, values[name])
                row.error = row.claimed_by = row.lease_expires_at = None
                row.updated_at = now
                row.artifacts.clear()
                session.flush()  # delete the old artifact rows before inserting ones with the same (kind, path)
                row.artifacts.extend(
                    [Artifact(kind=k, path=p, size_bytes=s) for (k, p), s in sorted(artifacts.items())]
                )
                updated += 1
    return MergeResult(inserted, updated, unchanged, tuple(skipped))


def _values(data: dict[str, Any], at: str | None = None) -> dict[str, Any]:
    """The row's column values, timestamps parsed (naive ones read as UTC)."""
    values = {name: data[name] for name in _FIELDS}
    for name in _TIMES:
        if values[name] is not None:
            try:
                values[name] = dt.datetime.fromisoformat(values[name])
            except (TypeError, ValueError):
                raise CacheError(
                    f"{at or 'bundle row ' + shown(data['identity'])}.{name} {shown(values[name])} is not an "
                    "ISO timestamp; refused"
                ) from None
            if values[name].tzinfo is None:
                values[name] = values[name].replace(tzinfo=dt.UTC)
    return values
