"""A precompiled artifact whose write failed (a full disk) leaves no ``.partial`` file, and one a kill left
behind is listed by ``cache scan`` and removed by ``cache doctor --fix``."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import time
from pathlib import Path

import pytest
from test_cache_neuron import cli, empty_registry
from test_precompiled import _header

from warmcache.artifacts.format import AOTINDUCTOR_DIR, PRECOMPILED_DIR, write_artifact


def test_a_failed_artifact_write_leaves_no_partial_file(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # a write past the limit fails (EFBIG) like one on a full disk
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(OSError) as caught:
            write_artifact(tmp_path, _header(), os.urandom(1_400_000))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert caught.value.errno == errno.EFBIG
    assert list((tmp_path / PRECOMPILED_DIR).iterdir()) == []


@pytest.mark.parametrize("folder", [PRECOMPILED_DIR, AOTINDUCTOR_DIR])
def test_a_leftover_partial_artifact_is_shown_by_scan_and_removed_by_doctor(folder: str, tmp_path: Path) -> None:
    root, db = tmp_path / "cache", empty_registry(tmp_path)
    partial = root / folder / f".{'ab' * 32}.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"x" * 1_400_000)
    os.utime(partial, (time.time() - 7200, time.time() - 7200))
    [info] = json.loads(cli("cache", "scan", "--cache-dir", str(root), "--db", db, "--json").stdout)
    assert [(w["path"], w["size_bytes"]) for w in info["work_dirs"]] == [(f"{folder}/{partial.name}", 1_400_000)]
    text = cli("cache", "scan", "--cache-dir", str(root), "--db", db).stdout
    assert "1 leftovers of interrupted work (1.3 MiB" in text and partial.name in text
    fixed = cli("cache", "doctor", "--cache-dir", str(root), "--db", db, "--fix")
    assert fixed.exit_code == 0 and not partial.exists(), fixed.output
