"""The benchmarks keep working: CI runs each one's ``--quick`` mode (``.ci/run``); these are the cheap checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from warmcache_testkit.manifests import generate, manifest_toml, model
from warmcache_testkit.scripts import load_script

from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import ShapeRecord
from warmcache.registry.statuses import Status

#: The benchmarks: scripts, each test loading the one it checks from its file.
BENCH = Path(__file__).resolve().parents[1] / "tools" / "bench"


def test_every_benchmark_has_a_quick_mode() -> None:
    benches = sorted(BENCH.glob("bench_*.py"))
    assert benches
    assert [b.name for b in benches if '"--quick"' not in b.read_text()] == []


def test_bench_guard_builds_a_compiled_record_of_every_column(write_manifest) -> None:
    compiled_record = load_script(BENCH / "bench_guard.py").compiled_record

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
    phases = load_script(BENCH / "bench_start.py").phases

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


def test_bench_start_fails_a_run_whose_mount_tokens_differ_from_the_packages(
    capsys: pytest.CaptureFixture[str],
) -> None:
    check_tokens = load_script(BENCH / "bench_start.py").check_tokens
    packaged = {"tokens": [5, 6, 7, 8]}
    results = {"floor": [{"tokens": [5, 6, 9, 9]}], "packages": [packaged, packaged], "mount": [packaged]}

    check_tokens(results)
    assert "same 4 tokens; floor's 2 of 4 equal" in capsys.readouterr().out

    results["mount"].append({"tokens": [5, 6, 7, 1]})
    with pytest.raises(SystemExit, match=r"mount: tokens \[5, 6, 7, 1\] differ from the packages' \[5, 6, 7, 8\]"):
        check_tokens(results)


def test_bench_warm_rerun_judges_its_target_only_in_full_runs() -> None:
    """It printed "ABOVE TARGET" and passed; a --quick run on CI's loaded 2 cores says nothing of the target."""
    verdict = load_script(BENCH / "bench_warm_rerun.py").verdict

    assert verdict(1.2, judged=True) == "target < 2 s: ok"
    assert verdict(3.72, judged=True) == "target < 2 s: ABOVE TARGET"
    assert verdict(3.72, judged=False) == "target < 2 s for 1,000 specs, judged in full runs only"


def test_bench_realistic_names_the_plain_route_by_the_backend_it_ran() -> None:
    """Its header said aot_eager and its row inductor."""
    shown_route = load_script(BENCH / "bench_realistic.py").shown_route

    assert [shown_route(r, "aot_eager") for r in ("inductor", "precompile", "aotinductor", "cold")] == [
        "aot_eager",
        "precompile",
        "aotinductor",
        "cold",
    ]


def test_the_fleet_simulations_first_use_warns_of_no_lost_claim(tmp_path: Path, caplog) -> None:
    """``bench_fleet --simulate --quick`` printed 24 x "row -1 compiled here but not recorded: the claim of first-use
    was lost" while reporting lost 0: the warm-up of a worker's statements on no row."""
    import logging

    from warmcache_testkit.fleet_sim import _first_use

    from warmcache.registry import Registry

    registry = Registry.open(f"sqlite:///{tmp_path / 'r.sqlite'}")
    try:
        with caplog.at_level(logging.DEBUG):
            _first_use(registry)
    finally:
        registry.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert logging.getLogger("warmcache.registry.registry").level == logging.NOTSET
