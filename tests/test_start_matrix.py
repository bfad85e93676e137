"""Fresh serving starts prime every bucket from the AOTInductor packages, whatever varies between pods.

Five starts of ``tools/start_matrix.py`` (which runs 200) over the suite's AOTInductor
warmup (``conftest.packaged``, shared), signed into a snapshot folder: between them they
vary HOME (fresh, missing), XDG_CACHE_HOME, TMPDIR, the working folder, where the folder
lies (where it was written, copied, moved, behind a symlink), the Python prefix (a second
venv with the same packages), the hostname and the uid where this machine allows. Each
must load every bucket's package with no graph traced and no compiler imported; a sixth,
from a folder whose packages were altered, must count as a miss that says why.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import pytest
from start_matrix import Scratch, can, export_snapshot, linked_venv, plan_starts, run_matrix, run_start


@pytest.mark.slow
def test_five_varied_starts_prime_every_bucket_from_the_packages(
    packaged: Path, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    root = tmp_path / "warm"  # a copy: the shared warmup's cache folder does not get this test's snapshot
    shutil.copytree(packaged, root, ignore=shutil.ignore_patterns("*.stderr"))
    snapshot, public_key = export_snapshot(root)
    scratch = Scratch(root, tiny_models["llama"], public_key, root / "manifest.toml")
    try:
        second = linked_venv(scratch.root / "other-prefix")
        starts = plan_starts(5, [sys.executable, second])
        reports = run_matrix(snapshot, scratch, starts, echo=False)
        # The matrix can fail: a start from a folder whose packages were altered is a miss, and says why.
        tampered = tmp_path / "tampered"
        shutil.copytree(snapshot, tampered)
        for package in (tampered / "aotinductor").iterdir():
            package.write_bytes(package.read_bytes()[:-1] + b"!")
        miss = run_start(dataclasses.replace(starts[0], snapshot="copied"), 5, tampered, scratch)
    finally:
        scratch.close()
    misses = [f"{start.describe()}: {report}" for start, report in zip(starts, reports) if not report["hit"]]
    assert not misses, "\n".join(misses)
    assert {r["buckets"] for r in reports} == {2} and len({r["prefix"] for r in reports}) == 2, reports
    if can(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "true"]):
        assert 65534 in {r["uid"] for r in reports}, reports
    if can(["unshare", "--uts", "hostname", "pod-probe"]):
        assert "pod-1" in {r["hostname"] for r in reports}, reports
    assert not miss["hit"] and "aotinductor" in " ".join(miss["stderr"]) and miss["cause"], miss
