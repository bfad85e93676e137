"""An Inductor cache folder holds CPU code for one platform: torch's FX graph cache key leaves out the vector ISA, and
a compile for another loads kernels written for the other vector width (warmcache/cache/platform_mark.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.inductor_host import InductorWarmup

from warmcache.cache.layout import list_entries
from warmcache.cache.platform_mark import MARK, claim_for_platform
from warmcache.errors import CacheError
from warmcache.registry import Registry

AVX512 = "cpu:x86_64:avx512f"
AVX2_ON_AVX512 = "cpu:x86_64:avx512f:ATEN_CPU_CAPABILITY=avx2"


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
