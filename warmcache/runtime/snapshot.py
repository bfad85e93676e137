"""Guard snapshots: the compiled rows a ShapeGuard needs, as a JSON file, for processes without database access.

A production replica often cannot (or should not) reach the fleet registry. The
deployment pipeline exports the compiled rows of a model once (``warmcache guard
export``) and ships the file next to the compile cache; the replica builds its
guard from the file. The rows keep their toolchain fingerprint, so a replica
whose torch or compiler differs from the one that compiled them still sees them
as stale and refuses to trust them, exactly as with the database.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from warmcache.errors import UsageError
from warmcache.registry.records import ADDED_COLUMNS, ArtifactRef, ShapeRecord

SNAPSHOT_FORMAT = "warmcache-guard-snapshot"
SNAPSHOT_VERSION = 1

_FIELDS = {f.name: f for f in dataclasses.fields(ShapeRecord)}
_DATETIME_FIELDS = frozenset(name for name, f in _FIELDS.items() if "datetime" in str(f.type))
_REQUIRED = frozenset(name for name, f in _FIELDS.items() if f.default is dataclasses.MISSING and name not in ADDED_COLUMNS)


def snapshot_document(records: Sequence[ShapeRecord], source: str) -> dict[str, Any]:
    """The snapshot as JSON-able data: what a file holds and what ``GET /v1/guard/{model}`` serves."""
    return {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "exported_at": dt.datetime.now(dt.UTC).isoformat(),
        "source": source,
        "records": [{k: v for k, v in r.as_json().items() if k in _FIELDS} for r in records],
    }


def write_snapshot(path: Path, records: Sequence[ShapeRecord], source: str) -> None:
    """Write ``records`` to ``path`` atomically (a reader never sees half a file)."""
    path = Path(path)
    text = json.dumps(snapshot_document(records, source), indent=1, sort_keys=True)
    # A unique temporary name in the target's folder (os.replace must not cross file
    # systems): two concurrent exports must not write into one temporary file, and a
    # failed export must not leave it behind.
    tmp: str | None = None
    try:
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False) as handle:
            tmp = handle.name
            handle.write(text)
        os.chmod(tmp, _new_file_mode())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise UsageError(f"{path}: cannot write snapshot: {exc.strerror}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def read_snapshot(path: Path) -> list[ShapeRecord]:
    """The rows stored in a snapshot file; every problem names the file and the key at fault."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: cannot read snapshot: {exc.strerror}") from None
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for a file that is not UTF-8
        raise UsageError(f"{path}: not a JSON file: {exc}") from None
    return parse_snapshot(document, str(path))


def parse_snapshot(document: Any, where: str) -> list[ShapeRecord]:
    """The rows of a decoded snapshot document; ``where`` (a file or URL) starts every error message."""
    if not isinstance(document, dict) or document.get("format") != SNAPSHOT_FORMAT:
        raise UsageError(f"{where}: not a warmcache guard snapshot (format must be {SNAPSHOT_FORMAT!r})")
    if document.get("version") != SNAPSHOT_VERSION:
        raise UsageError(f"{where}: snapshot version {document.get('version')!r} is not supported (expected {SNAPSHOT_VERSION})")
    records = document.get("records")
    if not isinstance(records, list):
        raise UsageError(f"{where}: key 'records' must be a list")
    return [_record(where, i, item) for i, item in enumerate(records)]


def _new_file_mode() -> int:
    """The mode ``open()`` would give a new file: mkstemp's 0600 would hide the snapshot from a replica running as another user."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _record(source: str, index: int, item: Any) -> ShapeRecord:
    where = f"{source}: records[{index}]"
    if not isinstance(item, dict):
        raise UsageError(f"{where} must be an object")
    missing = sorted(_REQUIRED - item.keys())
    if missing:
        raise UsageError(f"{where}: missing key(s) {', '.join(missing)}")
    values = {**ADDED_COLUMNS, **{k: v for k, v in item.items() if k in _FIELDS}}
    try:
        for name in _DATETIME_FIELDS:
            if values.get(name) is not None:
                values[name] = dt.datetime.fromisoformat(values[name])
        values["artifacts"] = tuple(ArtifactRef(a["kind"], a["path"], a.get("size_bytes")) for a in values.get("artifacts", ()))
    except (TypeError, ValueError, KeyError) as exc:
        raise UsageError(f"{where}: malformed value: {exc}") from None
    for name in ("batch_size", "seq_len"):
        if not isinstance(values[name], int) or values[name] < 1:
            raise UsageError(f"{where}.{name}: expected a positive integer, got {values[name]!r}")
    return ShapeRecord(**values)
