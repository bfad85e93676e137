"""``warmcache verify``: a real Inductor warmup, then a fresh process that must not compile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from warmcache.cache.layout import INDUCTOR_FXGRAPH, list_entries
from warmcache.registry import Registry
from warmcache.warmup.verify import RECOMPILED, REPLAY_FAILED, REPLAY_ONLY, VERIFIED, judge

MANIFEST = """
[[model]]
name = "served"
path = "{qwen3}"
backend = "inductor"
[[model.generate]]
batch_sizes = [2]
prompt_lengths = [8, 12]
max_cache_len = 16

[[model]]
name = "fast"
path = "{llama}"
backend = "aot_eager"
[[model.generate]]
batch_sizes = [1]
prompt_lengths = [8]
max_cache_len = 16
"""


def cli(*args: str) -> tuple[int, dict[str, Any], str]:
    result = subprocess.run([sys.executable, "-m", "warmcache", *args, "--json"], capture_output=True, text=True, timeout=600)
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


@pytest.mark.slow
def test_inductor_warmup_then_verify_in_a_fresh_process_has_zero_cache_misses(write_manifest, tmp_path: Path) -> None:
    path = write_manifest(MANIFEST)
    db, cache = f"sqlite:///{tmp_path / 'r.sqlite'}", tmp_path / "cache"

    code, report, err = cli("warmup", str(path), "--db", db, "--cache-dir", str(cache))
    assert code == 0 and report["compiled"] == 3, err
    with Registry.open(db) as registry:
        served, reuser = registry.rows(model="served", with_artifacts=True)
    # Both prompt lengths share one decode graph: the spec that reused it names its entries too.
    shared = {a.path for a in served.artifacts if a.kind == INDUCTOR_FXGRAPH} & {a.path for a in reuser.artifacts}
    assert shared, (served.artifacts, reuser.artifacts)
    assert served.cache_root is not None and Path(served.cache_root).resolve() == cache.resolve()
    # The artifacts are the Inductor cache entries this spec wrote, and they exist on disk.
    kinds = {a.kind for a in served.artifacts}
    assert INDUCTOR_FXGRAPH in kinds
    on_disk = list_entries(cache, "inductor")
    assert all(on_disk.get(a.path) == a.kind for a in served.artifacts)
    assert not any(".warmcache-locks" in a.path for a in served.artifacts)

    code, result, err = cli("verify", str(path), "--db", db, "--cache-dir", str(cache))
    assert code == 0, err
    verdicts = {s["spec"].split("/")[0]: s for s in result["specs"]}
    assert sum(s["verdict"] == VERIFIED for s in result["specs"]) == 2
    assert verdicts["served"]["verdict"] == VERIFIED
    assert verdicts["served"]["cache_misses"] == 0 and verdicts["served"]["cache_hits"] >= 1
    assert verdicts["served"]["new_entries"] == []
    assert verdicts["fast"]["verdict"] == REPLAY_ONLY  # aot_eager: nothing on disk to prove
    assert list_entries(cache, "inductor") == on_disk
    with Registry.open(db) as registry:
        assert sorted((r.model_name, r.status) for r in registry.rows()) == [("fast", "compiled"), ("served", "verified"), ("served", "verified")]

    # An empty cache folder: the same replay now compiles, so verify must say so and demote the row.
    code, result, err = cli("verify", str(path), "--db", db, "--cache-dir", str(tmp_path / "empty-cache"))
    assert code == 1
    served_verdict = next(s for s in result["specs"] if s["spec"].startswith("served/"))
    assert served_verdict["verdict"] == RECOMPILED and served_verdict["cache_misses"] >= 1, err
    with Registry.open(db) as registry:
        row = registry.rows(model="served")[0]
    assert row.status == "failed" and row.error and row.error.startswith("verify: ")


def test_judge_needs_zero_misses_and_no_new_entries() -> None:
    clean = {"graphs": 1, "cache_hits": 1, "cache_misses": 0, "new_entries": [], "persistent_cache": True}
    assert judge("i", "d", clean).verdict == VERIFIED
    assert judge("i", "d", clean | {"new_entries": ["fxgraph/ab/fabc"]}).verdict == RECOMPILED
    assert judge("i", "d", clean | {"cache_misses": 1}).verdict == RECOMPILED
    assert judge("i", "d", clean | {"persistent_cache": False}).verdict == REPLAY_ONLY
    assert judge("i", "d", {"error": "RuntimeError: boom"}).verdict == REPLAY_FAILED
    assert judge("i", "d", None).verdict == REPLAY_FAILED
