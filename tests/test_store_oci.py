"""push/pull/store over a real OCI registry (Debian's docker-registry, CNCF distribution 2.8) on loopback.

The same hand-built Neuron caches as the S3 and file store tests (``test_bundle.built``):
round trip host A → registry → host B and the image's own layout, a tampered layer
refused with nothing left behind, a tag re-pushed after a change, concurrent pushes to
one tag, ``gc`` deleting only what no tag references, htpasswd basic auth through
``$DOCKER_CONFIG``, skopeo copying the tag between repositories, and a registry that is
down or stalls ending within the command's deadline in one line.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import test_bundle
from oci_registry import RunningRegistry
from test_bundle import Built, files_under, rows
from test_store import error_lines, run

#: The build machine of the bundle tests: two compiled Neuron shapes, one declared but not compiled.
built = test_bundle.built


@pytest.fixture
def tag(registry_host: RunningRegistry) -> list[str]:
    """CLI arguments naming a fresh repository's tag on the session's registry."""
    return ["--store", registry_host.url(f"team/warm-{uuid.uuid4().hex[:8]}", "prod")]


def push(built: Built, store: list[str], *extra: str) -> dict:
    code, data, err = run("push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, *store, *extra)
    assert code == 0 and data is not None, err
    return data


def pull(built: Built, store: list[str], cache: Path, db: str, *extra: str) -> tuple[int, dict | None, str]:
    return run("pull", str(built.manifest), "--cache-dir", str(cache), "--db", db, "--allow-unsigned", *store, *extra)


def test_push_then_pull_round_trips_and_a_second_push_writes_nothing(built: Built, tag: list[str], tmp_path: Path) -> None:
    first = push(built, tag)
    assert (first["shapes"], first["indexes_written"], first["declared_but_not_compiled"]) == (2, 2, 1), first
    again = push(built, tag)
    assert (again["indexes_written"], again["indexes_unchanged"], again["blobs_uploaded"]) == (0, 2, 0), again

    cache, db = tmp_path / "host-b-cache", f"sqlite:///{tmp_path / 'host-b.sqlite'}"
    code, pulled, err = pull(built, tag, cache, db)
    assert code == 1 and pulled is not None, err  # the third declared shape was never compiled
    assert pulled["missing_in_store"] == ["neuron-m/generate float32 max_cache_len=64 batch=4 seq=16"]
    assert (pulled["shapes_pulled"], pulled["entries_added"], pulled["rows"]["inserted"]) == (2, 2, 2)
    expected = {k: v for k, v in files_under(built.root).items() if "unrelated" not in k}
    assert files_under(cache) == expected
    before = rows(db)
    code, second, _ = pull(built, tag, cache, db)
    assert second is not None and (second["shapes_already_present"], second["bytes_downloaded"]) == (2, 0)
    assert rows(db) == before
