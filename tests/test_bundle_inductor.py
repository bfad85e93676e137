"""End to end on a real Inductor cache: warmup → scan → pack → unpack elsewhere → verify.

One real Inductor warmup of one shape (≈30 s cold on 2 cores), in subprocesses
exactly as a deployment pipeline runs the commands.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MANIFEST = """
[cache]
dir = "{cache}"

[[model]]
name = "tiny-qwen3"
path = "{qwen3}"
backend = "inductor"

[[model.generate]]
batch_sizes = [1]
prompt_lengths = [8]
max_cache_len = 16
"""


def warmcache(*args: str) -> dict:
    """Run the CLI in a fresh process (as a pipeline would) and parse its --json output."""
    result = subprocess.run([sys.executable, "-m", "warmcache", *args, "--json"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"warmcache {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr[-3000:]}"
    return json.loads(result.stdout)


@pytest.mark.slow
def test_a_bundle_of_a_real_inductor_warmup_verifies_with_zero_cache_misses_elsewhere(tmp_path: Path, write_manifest) -> None:
    build_cache = tmp_path / "build-cache"
    manifest = write_manifest(MANIFEST.replace("{cache}", str(build_cache)))
    build_db = f"sqlite:///{tmp_path / 'build.sqlite'}"
    warmup = warmcache("warmup", str(manifest), "--db", build_db)
    assert warmup["compiled"] == 1 and warmup["ok"], warmup

    # The warmup's cache, cross-referenced with its registry row.
    [info] = warmcache("cache", "scan", "--manifest", str(manifest), "--db", build_db)
    assert info["flavor"] == "inductor" and info["root"] == str(build_cache)
    used = [e for e in info["entries"] if e["used_by"]]
    kinds = {e["kind"] for e in used}
    assert {"inductor-fxgraph", "inductor-code"} <= kinds, kinds
    assert {(u["model"], u["batch_size"], u["seq_len"], u["status"]) for e in used for u in e["used_by"]} == {("tiny-qwen3", 1, 8, "compiled")}
    assert info["missing"] == []

    bundle = tmp_path / "warm.tar.gz"
    packed = warmcache("bundle", "pack", str(manifest), "-o", str(bundle), "--db", build_db)
    assert packed["rows"] == 1 and packed["entries"] == len(used)

    # Production: an empty cache and an empty registry; the build cache is gone.
    shutil.move(build_cache, tmp_path / "build-cache-moved")
    prod_cache, prod_db = tmp_path / "prod-cache", f"sqlite:///{tmp_path / 'prod.sqlite'}"
    unpacked = warmcache("bundle", "unpack", str(bundle), "--cache-dir", str(prod_cache), "--db", prod_db)
    assert unpacked["entries_added"] == len(used) and unpacked["rows"]["inserted"] == 1
    verify = warmcache("verify", str(manifest), "--cache-dir", str(prod_cache), "--db", prod_db)
    assert verify["ok"] and verify["verified"] == 1, verify
    assert [s["cache_misses"] for s in verify["specs"]] == [0] and [s["new_entries"] for s in verify["specs"]] == [[]]

    # Doctor on the production cache: lose the FX graph entry and the row goes back to missing.
    fxgraph = next(e["path"] for e in used if e["kind"] == "inductor-fxgraph")
    shutil.rmtree(prod_cache / fxgraph)
    doctor = warmcache("cache", "doctor", "--cache-dir", str(prod_cache), "--db", prod_db, "--fix")
    assert [f["shape"] for f in doctor[0]["forget"]] == ["tiny-qwen3 generate batch=1 seq=8 (verified)"]
    plan = warmcache("plan", str(manifest), "--db", prod_db)
    assert [p["status"] for p in plan] == ["missing"]
