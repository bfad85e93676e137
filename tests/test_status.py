"""``warmcache status``: counts, claims in flight, failures and time left, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from warmcache_testkit.manifests import generate, manifest_toml, model, train

from warmcache.cli import main
from warmcache.identity.plan import PlannedShape, plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.reports.status import warmup_status
from warmcache.units import format_duration

MANIFEST = manifest_toml(
    model(
        "gen", backend="aot_eager", generate=[generate(batch_sizes=[1, 2, 4], prompt_lengths=[8, 16], max_cache_len=32)]
    ),
    model("tp", "{llama}", backend="eager", distributed={"tp_size": 2}, train=[train(seq_lengths=[16, 32])]),
)


def _planned(path: Path) -> list[PlannedShape]:
    return plan_manifest(load_manifest(path))


def _fleet_in_progress(url: str, planned: list[PlannedShape]) -> None:
    """gen: 3 compiled (2 s, 4 s, 12 s), 1 failed, 1 compiling on a live lease, 1 on an expired lease.

    tp: nothing in the registry yet (both shapes read as missing).
    """
    gen = [p for p in planned if p.model.name == "gen"]
    with Registry.open(url) as registry:
        registry.ensure_pending(gen)
        ids = [p.identity for p in gen]
        for seconds in (2.0, 4.0, 12.0):
            row = registry.claim(ids, "host-a:11", 60)
            assert row is not None
            registry.mark_compiled(row.id, "host-a:11", compile_seconds=seconds, graphs_compiled=1)
        row = registry.claim(ids, "host-b:22", 60)
        assert row is not None
        registry.mark_failed(row.id, "host-b:22", "\nRuntimeError: compiler crashed\n  at line 3\n", host="host-b")
        assert registry.claim(ids, "host-c:33", 600) is not None
        assert registry.claim(ids, "host-d:44", -5) is not None  # a worker that died: its lease already ran out


def test_status_counts_claims_failures_and_eta(registry_url: str, write_manifest) -> None:
    path = write_manifest(MANIFEST)
    planned = _planned(path)
    _fleet_in_progress(registry_url, planned)
    with Registry.open(registry_url) as registry:
        report = warmup_status(registry, planned)

    gen, tp = report.groups
    assert (gen.model, gen.workload, tp.model, tp.workload) == ("gen", "generate", "tp", "train")
    assert gen.counts == {"compiled": 3, "failed": 1, "compiling": 2}
    assert tp.counts == {"missing": 2}
    assert gen.median_compile_seconds == 4.0 and tp.median_compile_seconds is None

    claims = {c.claimed_by: c for c in gen.claims}
    assert set(claims) == {"host-c:33", "host-d:44"}
    assert (claims["host-c:33"].host, claims["host-c:33"].pid, claims["host-c:33"].lease_expired) == (
        "host-c",
        33,
        False,
    )
    assert claims["host-d:44"].lease_expired
    assert report.live_workers == ("host-c:33",)

    (failure,) = gen.failures
    assert (failure.error, failure.attempts, failure.host) == ("RuntimeError: compiler crashed", 1, "host-b")

    # Two compiling shapes left at a median of 4 s, one live worker; tp has no timings yet.
    assert report.eta_seconds(gen) == 8.0
    assert report.eta_seconds(tp) is None and report.eta_seconds() is None


def test_eta_is_shared_by_live_workers(registry_url: str, write_manifest) -> None:
    path = write_manifest(MANIFEST)
    gen = [p for p in _planned(path) if p.model.name == "gen"]
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(gen)
        ids = [p.identity for p in gen]
        for seconds in (3.0, 5.0):
            row = registry.claim(ids, "a:1", 60)
            assert row is not None
            registry.mark_compiled(row.id, "a:1", compile_seconds=seconds, graphs_compiled=1)
        for worker in ("a:1", "b:2"):
            assert registry.claim(ids, worker, 600) is not None
        report = warmup_status(registry, gen)
    (group,) = report.groups
    assert group.remaining == 4 and group.median_compile_seconds == 4.0
    assert report.live_workers == ("a:1", "b:2")
    assert report.eta_seconds() == 4 * 4.0 / 2


def test_stale_rows_count_as_remaining_and_lend_their_timings(registry_url: str, write_manifest) -> None:
    path = write_manifest(MANIFEST)
    gen = [p for p in _planned(path) if p.model.name == "gen"]
    old = [dataclasses.replace(p, toolchain=dataclasses.replace(p.toolchain, platform="an-older-machine")) for p in gen]
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(old)
        while (row := registry.claim([p.identity for p in old], "old:1", 60)) is not None:
            registry.mark_compiled(row.id, "old:1", compile_seconds=10.0, graphs_compiled=1)
        report = warmup_status(registry, gen)
    (group,) = report.groups
    assert group.counts == {"stale": 6}
    assert group.remaining == 6 and report.eta_seconds() == 60.0


def test_status_cli_json(registry_url: str, write_manifest) -> None:
    path = write_manifest(MANIFEST)
    _fleet_in_progress(registry_url, _planned(path))
    result = CliRunner().invoke(main, ["status", str(path), "--db", registry_url, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    gen = data["groups"][0]
    assert gen["counts"] == {
        "missing": 0,
        "stale": 0,
        "pending": 0,
        "compiling": 2,
        "compiled": 3,
        "verified": 0,
        "failed": 1,
    }
    assert gen["eta_seconds"] == 8.0 and data["eta_seconds"] is None
    assert {c["claimed_by"]: c["lease_expired"] for c in gen["claims"]} == {"host-c:33": False, "host-d:44": True}
    assert gen["failures"][0]["error"] == "RuntimeError: compiler crashed"
    assert data["live_workers"] == ["host-c:33"]
    assert data["groups"][1] == {
        "model": "tp",
        "workload": "train",
        "total": 2,
        "counts": {"missing": 2, "stale": 0, "pending": 0, "compiling": 0, "compiled": 0, "verified": 0, "failed": 0},
        "remaining": 2,
        "median_compile_seconds": None,
        "reclaimed": 0,
        "eta_seconds": None,
        "claims": [],
        "failures": [],
    }


def test_status_cli_text(registry_url: str, write_manifest) -> None:
    path = write_manifest(MANIFEST)
    _fleet_in_progress(registry_url, _planned(path))
    result = CliRunner().invoke(main, ["status", str(path), "--db", registry_url, "--model", "gen"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["model", "workload", "total", "compiling", "compiled", "failed", "median_s", "eta"]
    assert lines[1].split() == ["gen", "generate", "6", "2", "3", "1", "4.0", "8s"]
    assert "claims in flight:" in lines and "failures:" in lines
    assert any("host-d" in line and "EXPIRED" in line for line in lines)
    assert any("host-b" in line and line.endswith("RuntimeError: compiler crashed") for line in lines)
    assert lines[-1] == "2 of 6 shapes left; 1 live worker; eta 8s"


def test_status_of_an_unknown_model_is_a_usage_error(write_manifest, tmp_path: Path) -> None:
    path = write_manifest(MANIFEST)
    result = CliRunner().invoke(
        main, ["status", str(path), "--db", f"sqlite:///{tmp_path / 'r.sqlite'}", "--model", "nope"]
    )
    assert result.exit_code != 0
    assert "no model named 'nope'" in result.output


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "unknown"), (0.4, "0s"), (42, "42s"), (185, "3m05s"), (3720, "1h02m")]
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text
