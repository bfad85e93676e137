"""An Inductor cache folder holds CPU code for one platform: torch's FX graph cache key leaves out the vector ISA, and
a compile for another loads kernels written for the other vector width (warmcache/cache/platform_mark.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from warmcache_testkit.inductor_host import INDUCTOR_MODEL, InductorWarmup, warmcache_json

from warmcache.cache.layout import list_entries
from warmcache.cache.platform_mark import MARK, claim_for_platform, claim_for_rows
from warmcache.errors import CacheError
from warmcache.registry import Registry
from warmcache.runtime.guard import ShapeGuard

AVX512 = "cpu:x86_64:avx512f"
AVX2_ON_AVX512 = "cpu:x86_64:avx512f:ATEN_CPU_CAPABILITY=avx2"
#: Another machine's platform, whichever CPU runs the suite (avx2 was this one's on an AVX2-only host, where the
#: refusal then never came).
FOREIGN = "cpu:riscv64:rvv"


def test_the_first_platform_claims_the_folder_and_another_is_refused_naming_both(tmp_path: Path) -> None:
    claim_for_platform(tmp_path, AVX512)
    claim_for_platform(tmp_path, AVX512)  # the same platform again: its own code
    with pytest.raises(CacheError) as refused:
        claim_for_platform(tmp_path, AVX2_ON_AVX512)
    message = str(refused.value)
    assert str(tmp_path) in message and AVX512 in message and AVX2_ON_AVX512 in message, message
    assert "\n" not in message and (tmp_path / MARK).read_text().strip() == AVX512


def test_the_mark_is_no_cache_entry(tmp_path: Path) -> None:
    """Scans, prunes and bundles never take it for compiled code."""
    claim_for_platform(tmp_path, AVX512)
    assert list_entries(tmp_path, "inductor") == {}


def _row(device: str, backend: str, platform: str) -> dict[str, object]:
    return {"device": device, "backend": backend, "mode": "default", "toolchain": {"platform": platform}}


def test_installed_rows_claim_the_platform_their_inductor_cpu_code_was_generated_on(tmp_path: Path) -> None:
    """A bundle or pull brings its build machine's kernels: the folder is theirs, whatever machine unpacks it."""
    claim_for_rows(tmp_path, [_row("cpu", "aot_eager", AVX2_ON_AVX512), _row("cpu", "inductor", AVX512)], "bundle b")
    assert (tmp_path / MARK).read_text().strip() == AVX512  # eager rows carry no generated code
    with pytest.raises(CacheError, match=f"bundle b holds code generated for {AVX2_ON_AVX512}"):
        claim_for_rows(tmp_path, [_row("cpu", "inductor", AVX2_ON_AVX512)], "bundle b")


@pytest.mark.slow
def test_a_bundle_claims_the_folder_it_installs_into_and_one_of_another_platform_is_refused(
    inductor_warmup: InductorWarmup, tmp_path: Path
) -> None:
    host = inductor_warmup.copy(tmp_path / "host")
    bundle = tmp_path / "warm.tar.gz"
    warmcache_json("bundle", "pack", str(host.manifest), "-o", str(bundle), "--db", host.db)
    unpack = ["bundle", "unpack", "--allow-unsigned", str(bundle), "--json"]

    fresh = tmp_path / "fresh"
    warmcache_json(*unpack[:-1], "--cache-dir", str(fresh), "--db", f"sqlite:///{tmp_path / 'fresh.sqlite'}")
    assert (fresh / MARK).read_text() == (host.cache / MARK).read_text()

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / MARK).write_text(f"{FOREIGN}\n")
    db = tmp_path / "foreign.sqlite"
    done = subprocess.run(
        [sys.executable, "-m", "warmcache", *unpack, "--cache-dir", str(foreign), "--db", f"sqlite:///{db}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 5, done.stderr[-3000:]
    error = done.stderr.strip().splitlines()[-1]
    assert f"bundle {bundle} holds code generated for" in error and FOREIGN in error, error
    assert sorted(p.name for p in foreign.iterdir()) == [MARK] and not db.exists()


@pytest.mark.slow
def test_priming_a_guard_refuses_to_trace_from_an_inductor_cache_of_another_platform(
    inductor_warmup: InductorWarmup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Production's process compiles its buckets from torch's cache folder: foreign kernels there are wrong numbers."""
    import torch
    from transformers import AutoModelForCausalLM

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / MARK).write_text(f"{FOREIGN}\n")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(foreign))
    guard = ShapeGuard.from_registry(inductor_warmup.db, INDUCTOR_MODEL, telemetry=False)
    model = AutoModelForCausalLM.from_pretrained(inductor_warmup.model_path, dtype=torch.float32)
    with pytest.raises(CacheError, match=f"holds code generated for {FOREIGN}, and this process generates for"):
        guard.prime(model)
    assert not guard.primed and sorted(p.name for p in foreign.iterdir()) == [MARK]


@pytest.mark.slow
def test_a_warmup_for_another_vector_isa_on_a_warm_inductor_cache_is_refused_before_it_compiles(
    inductor_warmup: InductorWarmup, tmp_path: Path
) -> None:
    """Measured without the mark: avx2 after avx512 in one folder, wrong numbers (docs/measurements/criterion.md)."""
    host = inductor_warmup.copy(tmp_path / "host")
    with Registry.open(host.db) as registry:
        before = sorted((row.identity, row.status) for row in registry.rows())
    files_before = sorted(p.relative_to(host.cache) for p in host.cache.rglob("*"))
    warmup = ["warmup", str(host.manifest), "--db", host.db, "--cache-dir", str(host.cache)]
    done = subprocess.run(
        [sys.executable, "-m", "warmcache", *warmup],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},  # no vector ISA at all: another platform on any CPU
    )
    assert done.returncode == 5, done.stderr[-3000:]
    error = done.stderr.strip().splitlines()[-1]
    assert "ATEN_CPU_CAPABILITY=default" in error and "FX graph cache" in error and str(host.cache) in error, error
    with Registry.open(host.db) as registry:
        assert sorted((row.identity, row.status) for row in registry.rows()) == before
    assert sorted(p.relative_to(host.cache) for p in host.cache.rglob("*")) == files_before
