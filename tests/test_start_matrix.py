"""Fresh serving starts prime every bucket from the AOTInductor packages, whatever varies between pods.

Five starts of ``warmcache_testkit.start_matrix`` (which runs 200) over the suite's AOTInductor
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
import subprocess
import sys
from pathlib import Path

import pytest
from warmcache_testkit.start_matrix import (
    Scratch,
    can,
    exit_code,
    export_snapshot,
    linked_venv,
    plan_starts,
    run_matrix,
    run_start,
    summary,
)


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


def test_a_start_that_cannot_import_is_the_tools_failure_not_a_miss(tmp_path: Path) -> None:
    """``--starts 24`` reported 83.3 %: its 4 misses were uid 65534 starts through a second venv in the tool's own
    mode-700 folder, "No module named warmcache". A start whose interpreter cannot import what a replica imports is
    counted apart, out of the hit rate, and the exit status says so (2, not a miss's 1)."""
    bare = tmp_path / "bare-venv"  # an interpreter with none of the pins
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    (tmp_path / "model").mkdir()
    (tmp_path / "key.pub").write_text("unused")
    scratch = Scratch(tmp_path, tmp_path / "model", tmp_path / "key.pub", tmp_path / "manifest.toml")
    try:
        (start,) = plan_starts(1, [str(bare / "bin" / "python")])
        reports = [run_start(start, 0, tmp_path / "snapshot", scratch)]
        if can(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "true"]):
            # this venv, linked from a folder uid 65534 cannot enter (pytest's tmp folders are mode 700)
            hidden = dataclasses.replace(start, python=linked_venv(tmp_path / "hidden-venv"), uid=65534)
            reports.append(run_start(hidden, 1, tmp_path / "snapshot", scratch))
    finally:
        scratch.close()
    for report in reports:
        assert not report["hit"] and "cause" not in report, report
    assert "No module named 'torch'" in reports[0]["could_not_run"], reports
    if len(reports) > 1:
        assert "as uid 65534: " in reports[1]["could_not_run"], reports
    assert exit_code(reports) == 2 and exit_code([*reports, {"hit": False, "cause": "x"}]) == 1
    assert exit_code([{"hit": True}]) == 0
    said = summary([*reports, {"hit": True, "seconds": 3.0}], 2)
    assert said.startswith("1 fresh starts over 2 interpreters: 1 primed") and "(hit rate 100.0 %)" in said, said
    assert said.endswith(f"; {len(reports)} could not run (the tool's setup, not warmcache: see COULD NOT RUN above)")
