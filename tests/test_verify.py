"""``warmcache verify``: a real Inductor warmup (the suite's shared one), then a fresh process that must not compile."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from warmcache_testkit.inductor_host import INDUCTOR_MODEL, InductorWarmup
from warmcache_testkit.manifests import generate, manifest_toml, model
from warmcache_testkit.model_patch import mlp_scaled_env

from warmcache.cache.layout import INDUCTOR_FXGRAPH, list_entries
from warmcache.cli import main
from warmcache.errors import UsageError
from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.runtime.guard import ShapeGuard
from warmcache.settings import RegistryLocation
from warmcache.warmup.verify import ReplayResult, Verdict, judge, merge_ranks


def cli(*args: str) -> tuple[int, dict[str, Any], str]:
    result = subprocess.run(
        [sys.executable, "-m", "warmcache", *args, "--json"], capture_output=True, text=True, timeout=600
    )
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


@pytest.mark.slow
def test_inductor_warmup_then_verify_in_a_fresh_process_has_zero_cache_misses(
    inductor_warmup: InductorWarmup, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    # The suite's real Inductor warmup (its batch-2 shapes: prompts 8 and 12) plus an aot_eager model warmed here.
    build = inductor_warmup.copy(tmp_path / "build")
    path = tmp_path / "manifest.toml"
    path.write_text(
        manifest_toml(
            build.model(batch_sizes=(2,)),
            model(
                "fast",
                str(tiny_models["llama"]),
                backend="aot_eager",
                attn_implementation="eager",
                generate=[generate()],
            ),
        )
    )
    db, cache = build.db, build.cache
    served_name = INDUCTOR_MODEL

    code, report, err = cli("warmup", str(path), "--db", db, "--cache-dir", str(cache))
    assert code == 0 and (report["compiled"], report["already_compiled"]) == (1, 2), err
    with Registry.open(db) as registry:
        served, reuser = [r for r in registry.rows(model=served_name, with_artifacts=True) if r.batch_size == 2]
    # Both prompt lengths share one decode graph: the spec that reused it names its entries too.
    shared = {a.path for a in served.artifacts if a.kind == INDUCTOR_FXGRAPH} & {a.path for a in reuser.artifacts}
    assert shared, (served.artifacts, reuser.artifacts)
    # where it was compiled
    assert served.cache_root is not None and Path(served.cache_root).resolve() == inductor_warmup.cache.resolve()
    # The artifacts are the Inductor cache entries this spec wrote, and they exist on disk.
    kinds = {a.kind for a in served.artifacts}
    assert INDUCTOR_FXGRAPH in kinds
    on_disk = list_entries(cache, "inductor")
    assert all(on_disk.get(a.path) == a.kind for a in served.artifacts)
    assert not any(".warmcache-locks" in a.path for a in served.artifacts)

    code, result, err = cli("verify", str(path), "--db", db, "--cache-dir", str(cache))
    assert code == 0, err
    verdicts = {s["spec"].split("/")[0]: s for s in result["specs"]}
    assert sum(s["verdict"] == Verdict.VERIFIED for s in result["specs"]) == 2
    assert verdicts[served_name]["verdict"] == Verdict.VERIFIED
    assert verdicts[served_name]["cache_misses"] == 0 and verdicts[served_name]["cache_hits"] >= 1
    assert verdicts[served_name]["new_entries"] == []
    assert verdicts["fast"]["verdict"] == Verdict.REPLAY_ONLY  # aot_eager: nothing on disk to prove
    # The replay's lines say what it does: "compiling the decode step" read as if verify had compiled the shapes it
    # then reported verified with 0 cache misses.
    assert "compiling the decode step" not in err, err
    assert ": replaying the decode step (from the compile cache)" in err, err
    assert ": replaying the decode step (its backend keeps no compile cache)" in err, err
    assert ": proving the decode through warmcache's cache" in err, err
    assert list_entries(cache, "inductor") == on_disk
    identities = [p.identity for p in plan_manifest(load_manifest(path))]
    with Registry.open(db) as registry:
        assert sorted((r.model_name, r.status) for r in registry.rows(identities=identities)) == [
            ("fast", "compiled"),
            (served_name, "verified"),
            (served_name, "verified"),
        ]

    _frozen_inductor_shapes_are_stale_and_taken_by_warmup(str(path), db, cache)
    _eager_attention_rows_refuse_an_sdpa_model(db, tiny_models["llama"])

    # An empty cache folder: the same replay now compiles, so verify must say so and demote the row.
    code, result, err = cli("verify", str(path), "--db", db, "--cache-dir", str(tmp_path / "empty-cache"))
    assert code == 1
    served_verdict = next(s for s in result["specs"] if s["spec"].startswith(f"{served_name}/"))
    assert served_verdict["verdict"] == Verdict.RECOMPILED and served_verdict["cache_misses"] >= 1, err
    with Registry.open(db) as registry:
        [row] = registry.rows(identities=[served_verdict["identity"]])
    assert row.status == "failed" and row.error and row.error.startswith("verify: ")


@pytest.mark.slow
def test_verify_fails_a_model_whose_code_changed_since_warmup(inductor_warmup: InductorWarmup, tmp_path: Path) -> None:
    """Same checkpoint, same config, a layer computing 5 % more (a monkeypatch in verify's processes only): the replay
    traces another graph, which misses the cache and compiles, so production would too."""
    build = inductor_warmup.copy(tmp_path / "build")
    path = tmp_path / "manifest.toml"
    path.write_text(manifest_toml(build.model(batch_sizes=(2,), prompt_lengths=(8,))))
    done = subprocess.run(
        [sys.executable, "-m", "warmcache", "verify", str(path), "--db", build.db, "--cache-dir", str(build.cache)],
        capture_output=True,
        text=True,
        timeout=600,
        env=mlp_scaled_env(tmp_path / "patch", "qwen3", "Qwen3MLP"),
    )
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert re.search(rf"^recompiled: {INDUCTOR_MODEL}/generate .* batch=2 seq=8: [1-9]\d* cache miss", said, re.M), said


def _frozen_inductor_shapes_are_stale_and_taken_by_warmup(path: str, db: str, cache: Path) -> None:
    """Under TORCHINDUCTOR_FREEZING=1 Inductor compiles other code: its shapes read stale and say why; aot_eager's do
    not move.

    In this process (CliRunner sets the variable for each call): these commands compile nothing.
    """

    def run(*args: str, frozen: bool = False) -> Any:
        result = CliRunner().invoke(
            main, [*args, "--db", db, "--json"], env={"TORCHINDUCTOR_FREEZING": "1" if frozen else None}
        )
        # explain says no with 1 when any shape it explains is not usable here
        assert result.exit_code == (1 if args[0] == "explain" and frozen else 0), result.output
        return json.loads(result.stdout)

    before = run("plan", path)
    planned = run("plan", path, frozen=True)
    assert [(p["model"], p["status"]) for p in planned] == [
        (INDUCTOR_MODEL, "stale"),
        (INDUCTOR_MODEL, "stale"),
        ("fast", "compiled"),
    ]
    explained = run("explain", path, frozen=True)
    assert [(e["model"], e["reason"]) for e in explained] == [
        (INDUCTOR_MODEL, "stale: inductor TORCHINDUCTOR_FREEZING unset → 1")
    ] * 2
    # Which shapes warmup takes, without paying for the compile. (A real run under freezing claims exactly these two
    # and then fails in Inductor's generated kernel for this tiny model's static-cache decode step: "index out of
    # bounds: 0 <= tmp9 < 16"; seen with torch 2.13, not investigated here.)
    report = run("warmup", path, "--cache-dir", str(cache), "--dry-run", frozen=True)
    assert report["to_compile"] == 2
    assert [(p["spec"].split("/")[0], p["action"]) for p in report["plan"]] == [
        (INDUCTOR_MODEL, "compile"),
        (INDUCTOR_MODEL, "compile"),
        ("fast", "skip (compiled)"),
    ]
    assert run("plan", path) == before  # unset, the first rows serve again


def _eager_attention_rows_refuse_an_sdpa_model(db: str, llama: Path) -> None:
    """Rows warmed with attn_implementation='eager' guard an eager model and refuse the same checkpoint on sdpa."""
    import torch
    from transformers import AutoModelForCausalLM

    guard = ShapeGuard.from_registry(db, "fast", telemetry=False)
    sdpa = AutoModelForCausalLM.from_pretrained(llama, attn_implementation="sdpa")
    with pytest.raises(
        UsageError,
        match="model 'fast': attn_implementation 'sdpa' matches no compiled rows .compiled with "
        "attn_implementation 'eager'",
    ):
        guard.prime(sdpa)
    report = guard.prime(AutoModelForCausalLM.from_pretrained(llama, attn_implementation="eager"))
    assert guard.primed and report.graphs >= 1
    torch._dynamo.reset()


def test_judge_needs_zero_misses_and_no_new_entries() -> None:
    clean = ReplayResult("i", graphs=1, cache_hits=1, cache_misses=0, new_entries=(), persistent_cache=True)
    assert judge("i", "d", clean).verdict == Verdict.VERIFIED
    # the progress line
    assert judge("i", "d", clean).message() == "verified (0 cache misses, 1 hits, 1 graph traced in 0.0s)"
    assert judge("i", "d", replace(clean, new_entries=("fxgraph/ab/fabc",))).verdict == Verdict.RECOMPILED
    assert judge("i", "d", replace(clean, cache_misses=1)).verdict == Verdict.RECOMPILED
    assert judge("i", "d", replace(clean, persistent_cache=False)).verdict == Verdict.REPLAY_ONLY
    # "replay-only" alone reads like a mode the user chose, or half a failure: the line says what it means
    assert judge("i", "d", replace(clean, persistent_cache=False, cache_hits=0)).message() == (
        "replay-only (ran without error, 1 graph traced in 0.0s; its backend keeps no compile cache on disk, so no "
        "cache hit can be proven and the row stays compiled)"
    )
    assert judge("i", "d", replace(clean, decode_error="artifact rejected")).verdict == Verdict.DISPROVEN
    assert judge("i", "d", ReplayResult("i", error="RuntimeError: boom")).verdict == Verdict.REPLAY_FAILED
    assert judge("i", "d", ReplayResult("i", recompiled="guard failed at step 2")).verdict == Verdict.RECOMPILED
    assert judge("i", "d", None).verdict == Verdict.REPLAY_FAILED
    # the verdicts that prove the row wrong send it back to failed; one that proves nothing keeps it
    assert [v for v in Verdict if v.demotes] == [Verdict.RECOMPILED, Verdict.DISPROVEN]


def test_sharded_replays_merge_into_one_result_naming_the_failing_rank() -> None:
    ok = ReplayResult("i", 1.0, graphs=1, cache_hits=2, new_entries=("a",), persistent_cache=True)
    merged = merge_ranks([ok, replace(ok, seconds=2.0, cache_misses=1, new_entries=("b",))])
    assert (merged.seconds, merged.cache_hits, merged.cache_misses, merged.new_entries) == (2.0, 4, 1, ("a", "b"))
    assert merge_ranks([replace(ok, recompiled="step 2"), replace(ok, error="OOM")]).error == "rank 1: OOM"
    assert merge_ranks([ok, replace(ok, recompiled="step 2")]).recompiled == "rank 1: step 2"


#: A replay process that reports its first spec, then dies (or refuses at once): the protocol's real files, no torch.
_STOPPING_REPLAY = """
import os, sys
from warmcache.errors import RegistryError
from warmcache.warmup.child import ReportWriter, read_request
from warmcache.warmup.verify import ReplayRequest, ReplayResult

with ReportWriter(sys.argv[-1]) as reports, reports.failures_reported():
    request = read_request(sys.argv[-2], [ReplayRequest])
    if os.environ["HOW"] == "refuse":
        raise RegistryError("registry x: unreachable")
    reports.send(ReplayResult(request.identities[0], 0.5, graphs=1, persistent_cache=False))
    os._exit(7)
"""


@pytest.mark.parametrize("how", ["crash", "refuse"])
def test_a_replay_that_stops_early_keeps_the_verdicts_it_sent(
    how: str, write_manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_cli_query import _compile_all

    from warmcache.warmup import distributed
    from warmcache.warmup.child import ChildError
    from warmcache.warmup.verify import run_verify

    path = write_manifest(manifest_toml(model("m", backend="aot_eager", generate=[generate(batch_sizes=[1, 2, 3])])))
    db = f"sqlite:///{tmp_path / 'r.sqlite'}"
    _compile_all(db, path)
    script = tmp_path / "stopping_replay.py"
    script.write_text(_STOPPING_REPLAY)
    monkeypatch.setenv("HOW", how)
    monkeypatch.setattr(distributed, "child_command", lambda nproc: [sys.executable, str(script)])
    if how == "refuse":  # nothing replayed: verify stops with the child's own error and exit code
        with pytest.raises(ChildError, match=r"^verify's replay \(1 rank\): registry x: unreachable$") as refused:
            run_verify(load_manifest(path), RegistryLocation.parse(db))
        assert refused.value.exit_code == 3
        return
    summary = run_verify(load_manifest(path), RegistryLocation.parse(db))
    first, *rest = summary.verdicts
    assert first.verdict == Verdict.REPLAY_ONLY and first.measured.graphs == 1
    assert [v.verdict for v in rest] == [Verdict.REPLAY_FAILED, Verdict.REPLAY_FAILED]
    assert all(
        v.reason == "the replay stopped before this spec: verify's replay (1 rank) exited with code 7 after "
        "1 result(s); see its output above"
        for v in rest
    )
    with Registry.open(db) as registry:
        # a replay that proved nothing demotes nothing
        assert {r.status for r in registry.rows(model="m")} == {"compiled"}
