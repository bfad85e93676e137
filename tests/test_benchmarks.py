"""The benchmarks keep working: CI runs each one's ``--quick`` mode (``.ci/run``); these are the cheap checks."""

from __future__ import annotations

from pathlib import Path

from manifests import generate, manifest_toml, model

from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import ShapeRecord
from warmcache.registry.statuses import Status

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def test_every_benchmark_has_a_quick_mode() -> None:
    benches = sorted(TOOLS.glob("bench_*.py"))
    assert benches
    assert [b.name for b in benches if '"--quick"' not in b.read_text()] == []


def test_bench_guard_builds_a_compiled_record_of_every_column(write_manifest) -> None:
    from bench_guard import compiled_record

    path = write_manifest(manifest_toml(model("m", generate=[generate()])))
    planned = plan_manifest(load_manifest(path))[0]
    record = compiled_record(planned, 7)
    assert isinstance(record, ShapeRecord)
    assert (record.id, record.identity, record.status, record.batch_size, record.seq_len) == (
        7,
        planned.identity,
        Status.COMPILED,
        1,
        8,
    )


def test_bench_start_splits_a_start_into_its_phases_in_order() -> None:
    from bench_start import phases

    # The floor's stamps: no warmcache phases; the first token lands inside the request.
    stamps = {"python": 10.1, "torch": 11.0, "transformers": 12.0, "weights": 14.5, "first_token": 15.0}
    seconds = phases(10.0, {**stamps, "request": 17.0})
    assert "prime" not in seconds
    assert [round(seconds[k], 3) for k in ("python", "torch", "weights", "first_token", "request")] == [
        0.1,
        0.9,
        2.5,
        0.5,
        2.0,
    ]
    assert (round(seconds["to_first_token"], 3), round(seconds["to_request"], 3)) == (5.0, 7.0)
