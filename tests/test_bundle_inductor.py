"""End to end on a real Inductor cache: warmup → scan → prune → pack → unpack elsewhere → verify.

The suite's one real Inductor warmup (conftest's ``inductor_warmup``), copied and seen through a manifest of two of its
shapes (batch 1 and 2), then every step in a subprocess exactly as a deployment pipeline runs the commands. The second
shape's graph loads kernel files that only the first shape's row records; after the first row is forgotten and its
entries pruned, the second must still verify from a bundle with zero cache misses and no new entries.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from warmcache_testkit.inductor_host import InductorWarmup
from warmcache_testkit.inductor_host import warmcache_json as warmcache

from warmcache.registry import Registry


@pytest.mark.slow
def test_a_bundle_of_a_real_inductor_warmup_verifies_with_zero_cache_misses_elsewhere(
    inductor_warmup: InductorWarmup, tmp_path: Path
) -> None:
    warmup = inductor_warmup.report
    assert warmup["compiled"] == 4 and warmup["ok"], warmup
    build = inductor_warmup.copy(tmp_path / "build")
    manifest = build.manifest_for(tmp_path / "manifest.toml", prompt_lengths=(8,))  # two of its shapes: batch 1 and 2
    build_cache, build_db = build.cache, build.db

    # The warmup's cache, cross-referenced with its registry rows.
    [info] = warmcache("cache", "scan", "--manifest", str(manifest), "--db", build_db)
    assert info["flavor"] == "inductor" and info["root"] == str(build_cache) and info["missing"] == []
    users = {e["path"]: {u["batch_size"] for u in e["used_by"]} for e in info["entries"]}
    kinds = {e["kind"] for e in info["entries"] if e["used_by"]}
    assert {"inductor-fxgraph", "inductor-aotautograd", "inductor-code"} <= kinds, kinds
    assert {b for batches in users.values() for b in batches} == {1, 2}
    first_only = {p for p, batches in users.items() if batches == {1}}

    # Lose the batch=1 row (as doctor does when its graph is gone), then prune the orphans:
    # its graph entries go, the kernel files the batch=2 graph also loads must stay.
    with Registry.open(build_db) as registry:
        registry.forget([r.id for r in registry.rows() if r.batch_size == 1])
    [pruned] = warmcache("cache", "prune", "--manifest", str(manifest), "--db", build_db, "--orphans", "--grace", "0s")
    removed = set(pruned["result"]["removed"])
    assert removed and removed <= first_only
    assert {p for p in removed if not p.startswith(("fxgraph/", "aotautograd/"))} == set()

    bundle = tmp_path / "warm.tar.gz"
    packed = warmcache("bundle", "pack", str(manifest), "-o", str(bundle), "--db", build_db)
    assert packed["rows"] == 1 and packed["declared_but_not_compiled"] == 1

    # Production: an empty cache and an empty registry; the build cache is gone.
    shutil.move(build_cache, tmp_path / "build-cache-moved")
    prod_cache, prod_db = tmp_path / "prod-cache", f"sqlite:///{tmp_path / 'prod.sqlite'}"
    unpacked = warmcache(
        "bundle", "unpack", "--allow-unsigned", str(bundle), "--cache-dir", str(prod_cache), "--db", prod_db
    )
    assert unpacked["entries_added"] == packed["entries"] and unpacked["rows"]["inserted"] == 1
    verify = warmcache("verify", str(manifest), "--cache-dir", str(prod_cache), "--db", prod_db, ok_codes=(0, 1))
    [spec] = verify["specs"]
    assert (spec["verdict"], spec["cache_misses"], spec["new_entries"]) == ("verified", 0, []), spec
    assert verify["not_compiled"] == ["tiny-qwen3/generate float32 max_cache_len=16 batch=1 seq=8"]

    # Doctor on the production cache: lose the FX graph entry and the row goes back to missing.
    fxgraph = next(p for p in users if p.startswith("fxgraph/") and users[p] == {2})
    shutil.rmtree(prod_cache / fxgraph)
    doctor = warmcache("cache", "doctor", "--cache-dir", str(prod_cache), "--db", prod_db, "--fix")
    assert [f["shape"] for f in doctor[0]["forget"]] == ["tiny-qwen3 generate batch=2 seq=8 (verified)"]
    plan = warmcache("plan", str(manifest), "--db", prod_db)
    assert [p["status"] for p in plan] == ["missing", "missing"]
