"""``store check [--repair]``: scrub a whole store, every blob against its name and every index against its blobs.

A blob's key *is* its sha256, so a blob is checked without any index: S3's own
checksum where it kept one (no download), its bytes hashed otherwise. Each index
is validated completely (its signature too, when trusted keys are given) and every
blob it names must be there. ``--repair`` uploads again each damaged or missing
blob that a local cache holds: the indexes say which cache file has that sha256,
and the file is hashed again before it is sent (push's own upload refuses bytes
that are not the blob's name).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warmcache.errors import CacheError
from warmcache.store.blob.maintenance import is_blob, stored_indexes
from warmcache.store.index import BLOB_PREFIX, blob_key, parse_index
from warmcache.store.interface import CheckReport, StoreProblem
from warmcache.store.objects import ObjectStore
from warmcache.trust import NOT_CONFIGURED, TrustedKeys


def check_objects(
    store: ObjectStore, trusted: TrustedKeys = NOT_CONFIGURED, progress: Callable[[int, int], None] | None = None
) -> tuple[CheckReport, Any]:
    """The report, and what a repair needs: for each referenced blob the cache paths the indexes give it."""
    problems: list[StoreProblem] = []
    named: dict[str, set[str]] = {}
    indexes = 0
    for key, data in stored_indexes(store):
        indexes += 1
        try:
            index = parse_index(data, key, store.url, trusted)
        except CacheError as exc:  # TrustError included: a bad signature is a problem of this index
            problems.append(StoreProblem(key, "index", str(exc)))
            continue
        for file in index.files.values():
            named.setdefault(file.sha256, set()).add(file.path)
    blobs = [b for b in store.list(BLOB_PREFIX) if is_blob(b.key)]
    total, done = sum(b.size for b in blobs), 0
    for blob in blobs:
        name = blob.key.rsplit("/", 1)[1]
        actual = store.sha256_of(blob.key)
        if actual is not None and actual != name:
            problems.append(StoreProblem(blob.key, "damaged", f"its bytes hash to {actual[:16]}…, not its name"))
        done += blob.size
        if progress:
            progress(done, total)
    stored = {b.key for b in blobs}
    problems += [
        StoreProblem(blob_key(sha), "missing", f"named by an index as {sorted(paths)[0]}")
        for sha, paths in sorted(named.items())
        if blob_key(sha) not in stored
    ]
    return CheckReport(store.url, indexes, len(blobs), tuple(problems)), named


def repair_objects(store: ObjectStore, report: CheckReport, named: Any, cache_root: Path) -> CheckReport:
    """Upload again each damaged or missing blob whose bytes a file of ``cache_root`` holds; the report of what is
    left."""
    repaired: list[str] = []
    left: list[StoreProblem] = []
    for problem in report.problems:
        sha256 = problem.key.rsplit("/", 1)[1]
        source = (
            _local_copy(cache_root, named.get(sha256, set()), sha256)
            if problem.problem in ("damaged", "missing")
            else None
        )
        if source is None:
            left.append(problem)
            continue
        store.upload(source, problem.key, sha256)
        repaired.append(problem.key)
    return CheckReport(report.url, report.indexes, report.blobs, tuple(left), tuple(repaired))


def _local_copy(root: Path, paths: set[str], sha256: str) -> Path | None:
    """A file under ``root`` at one of ``paths`` whose bytes are ``sha256``, or ``None``."""
    for path in sorted(paths):
        candidate = root / path
        try:
            with candidate.open("rb") as handle:
                if hashlib.file_digest(handle, "sha256").hexdigest() == sha256:
                    return candidate
        except OSError:
            continue
    return None
