"""Guard snapshots: the compiled rows a ShapeGuard needs, as a JSON file, for processes without database access.

A production replica often cannot (or should not) reach the fleet registry. The
deployment pipeline exports the compiled rows of a model once (``warmcache guard
export``) and ships the file next to the compile cache; the replica builds its
guard from the file. The rows keep their toolchain fingerprint, so a replica
whose torch or compiler differs from the one that compiled them still sees them
as stale and refuses to trust them, exactly as with the database.

Rows name precompiled artifacts, which are code, so a snapshot is signed like a
bundle or a store index (``guard export --sign``, ``serve --sign``: an Ed25519
``signature`` member over the canonical bytes of the rest, :mod:`warmcache.trust`).
:func:`verify_snapshot` is the one gate: a snapshot file or folder and the trusted
keys in, verified rows or a one-line :class:`~warmcache.errors.TrustError` out. A
snapshot *folder* holds :data:`SNAPSHOT_FILE` beside the cache entries it names.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache.bounds import MAX_NESTING, json_nesting
from warmcache.errors import UsageError, shown
from warmcache.registry.records import ADDED_COLUMNS, ArtifactRef, ShapeRecord
from warmcache.trust import NOT_CONFIGURED, SignatureCheck, SigningKey, TrustedKeys, require_trust, sign_document

SNAPSHOT_FORMAT = "warmcache-guard-snapshot"
SNAPSHOT_VERSION = 1
#: The snapshot's name inside a snapshot folder (the folder also holds the cache entries the rows name).
SNAPSHOT_FILE = "warmcache-guard.json"

#: What a row says about the host that holds it (its database id, its cache folder, the model's path there, who
#: claimed it, its last error): never part of a snapshot, which any reader may fetch (``GET /v1/guard``) and which
#: travels to other hosts; a snapshot's artifacts load from the reader's own cache folder.
HOST_LOCAL = {
    "id": 0,
    "model_path": "",
    "host": None,
    "claimed_by": None,
    "lease_expires_at": None,
    "cache_root": None,
    "error": None,
}

_FIELDS = {f.name: f for f in dataclasses.fields(ShapeRecord)}
_DATETIME_FIELDS = frozenset(name for name, f in _FIELDS.items() if "datetime" in str(f.type))
_REQUIRED = frozenset(
    name for name, f in _FIELDS.items() if f.default is dataclasses.MISSING and name not in ADDED_COLUMNS
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A snapshot's rows and what the check of its signature found."""

    records: list[ShapeRecord]
    signature: SignatureCheck
    where: str


def snapshot_document(
    records: Sequence[ShapeRecord], source: str, signing_key: SigningKey | None = None
) -> dict[str, Any]:
    """The snapshot as JSON-able data: what a file holds and what ``GET /v1/guard/{model}`` serves (signed with
    ``signing_key``), each row without its :data:`HOST_LOCAL` fields."""
    document = {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "exported_at": dt.datetime.now(dt.UTC).isoformat(),
        "source": source,
        "records": [{**{k: v for k, v in r.as_json().items() if k in _FIELDS}, **HOST_LOCAL} for r in records],
    }
    return sign_document(document, signing_key) if signing_key else document


def snapshot_file(path: Path) -> Path:
    """The snapshot file of ``path``: itself, or :data:`SNAPSHOT_FILE` inside a snapshot folder."""
    return path / SNAPSHOT_FILE if path.is_dir() else path


def write_snapshot(
    path: Path, records: Sequence[ShapeRecord], source: str, signing_key: SigningKey | None = None
) -> Path:
    """Write ``records`` to ``path`` (a file, or a folder to hold :data:`SNAPSHOT_FILE`) atomically; returns the file
    written."""
    path = snapshot_file(Path(path))
    text = json.dumps(snapshot_document(records, source, signing_key), indent=1, sort_keys=True)
    # A unique temporary name in the target's folder (os.replace must not cross file
    # systems): two concurrent exports must not write into one temporary file, and a
    # failed export must not leave it behind.
    tmp: str | None = None
    try:
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
        ) as handle:
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
    return path


def verify_snapshot(path: str | Path, trusted: TrustedKeys, *, allow_unsigned: bool = False) -> Snapshot:
    """The rows of a snapshot file or folder, verified by one of ``trusted``'s keys, or :class:`TrustError` (one line).

    Without trusted keys nothing can be verified, so the snapshot is refused unless
    ``allow_unsigned`` says its code may run unverified (as ``pull --allow-unsigned``).
    """
    file = snapshot_file(Path(path))
    require_trust(trusted, allow_unsigned, f"{file}: guard snapshot")
    return read_snapshot(file, trusted)


def read_snapshot(path: Path, trusted: TrustedKeys = NOT_CONFIGURED) -> Snapshot:
    """The rows stored in a snapshot file, its signature checked when ``trusted`` has keys; every problem names the
    file and the key at fault."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read snapshot: {exc.strerror}") from None
    return decode_snapshot(data, str(path), trusted)


def decode_snapshot(data: bytes, where: str, trusted: TrustedKeys = NOT_CONFIGURED) -> Snapshot:
    """A snapshot from its bytes (a file or ``GET /v1/guard`` answer); ``where`` starts every error message.

    Nesting is bounded before ``json`` recurses into it, and the signature is checked
    (when ``trusted`` has keys) before any row is read.
    """
    depth = json_nesting(data)
    if depth > MAX_NESTING:
        raise UsageError(f"{where}: nests {depth} levels deep; a guard snapshot needs at most {MAX_NESTING}; refused")
    try:
        document = json.loads(data.decode("utf-8"))
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for a file that is not UTF-8
        raise UsageError(f"{where}: not a JSON file: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != SNAPSHOT_FORMAT:
        raise UsageError(f"{where}: not a warmcache guard snapshot (format must be {SNAPSHOT_FORMAT!r})")
    if document.get("version") != SNAPSHOT_VERSION:
        raise UsageError(
            f"{where}: snapshot version {shown(document.get('version'))} is not supported (expected {SNAPSHOT_VERSION})"
        )
    signature = trusted.check_document(document, f"{where}: guard snapshot")
    records = document.get("records")
    if not isinstance(records, list):
        raise UsageError(f"{where}: key 'records' must be a list")
    return Snapshot([_record(where, i, item) for i, item in enumerate(records)], signature, where)


def _new_file_mode() -> int:
    """The mode ``open()`` would give a new file: mkstemp's 0600 would hide the snapshot from a replica running as
    another user."""
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
        values["artifacts"] = tuple(
            ArtifactRef(a["kind"], a["path"], a.get("size_bytes")) for a in values.get("artifacts", ())
        )
    except (TypeError, ValueError, KeyError) as exc:
        raise UsageError(f"{where}: malformed value: {exc}") from None
    for name in ("batch_size", "seq_len"):
        if not isinstance(values[name], int) or values[name] < 1:
            raise UsageError(f"{where}.{name}: expected a positive integer, got {values[name]!r}")
    return ShapeRecord(**values)
