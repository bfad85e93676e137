"""Progress inside a spec: the phases a running spec reports (warmcache.warmup.phases) and how the CLI shows them
(warmcache.cli.running).

The reporting and rendering logic is tested on an explicit clock, so nothing here
waits for a timer to prove a line is due; the real runs (a Worker on a tiny
model, a ``--jobs`` warmup through child processes) prove that real
``generate()``, the real Trainer and the child protocol carry the phases.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from warmcache_testkit.manifests import generate, manifest_toml, model, train

from warmcache.cli.progress import BarProgress, LineProgress
from warmcache.cli.running import RunningPhases
from warmcache.errors import WarmcacheError
from warmcache.warmup.child import decode, encode
from warmcache.warmup.phases import STEP_REPORT_SECONDS, Phase, PhaseReport, SpecPhases
from warmcache.warmup.progress import Outcome, SpecOutcome

SPEC = "m/generate float32 max_cache_len=16 batch=1 seq=8"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_spec_reports_each_phase_and_its_steps_at_most_once_a_second_but_always_the_last() -> None:
    clock, got = Clock(), []
    phases = SpecPhases(SPEC, got.append, clock)
    phases.enter(Phase.LOADING)
    clock.now += 2
    phases.enter(Phase.DECODING, steps=10, detail="unpadded")
    streamer = phases.decode_streamer()
    assert streamer is not None
    streamer.put("the prompt")  # generate() hands the prompt first: not a step
    for step in range(1, 11):
        clock.now += 0.3
        streamer.put(f"token {step}")
    assert [(r.phase, r.step, r.steps, r.detail) for r in got] == [
        (Phase.LOADING, 0, 0, ""),
        (Phase.DECODING, 0, 10, "unpadded"),
        (Phase.DECODING, 4, 10, "unpadded"),  # 1.2 s in: the first step a second after the last report
        (Phase.DECODING, 8, 10, "unpadded"),
        (Phase.DECODING, 10, 10, "unpadded"),  # the last step, however soon
    ]
    assert got[2].seconds == pytest.approx(4 * 0.3) and got[-1].seconds == pytest.approx(3.0)
    assert STEP_REPORT_SECONDS == 1.0
    assert {r.spec for r in got} == {SPEC} and len({r.process for r in got}) == 1
    assert got[-1].text() == "decoding: 10/10 steps (unpadded)"

    quiet = SpecPhases(SPEC, None)
    quiet.enter(Phase.LOADING)
    assert quiet.decode_streamer() is None  # nobody listens: generate() gets no streamer at all


def test_a_listener_that_fails_never_fails_the_spec() -> None:
    calls = []

    def broken(report: PhaseReport) -> None:
        calls.append(report)
        raise BrokenPipeError("stderr is gone")

    phases = SpecPhases(SPEC, broken)
    phases.enter(Phase.COMPILING)  # does not raise
    phases.enter(Phase.DECODING, steps=3)
    phases.step(3)
    assert len(calls) == 1  # dropped after its first failure: no cost, no exception per step


def test_phase_reports_travel_the_child_protocol_next_to_the_results() -> None:
    report = PhaseReport(SPEC, Phase.PACKAGING, 12.5, process=4242)
    line = encode(report)
    assert decode(line, [SpecOutcome, PhaseReport]) == report
    assert decode(line, [PhaseReport]).phase is Phase.PACKAGING  # the enum, not the JSON text
    with pytest.raises(WarmcacheError, match="malformed message"):
        decode(line.replace('"building the package"', '"napping"'), [PhaseReport])


def test_plain_lines_say_each_phase_as_it_starts_and_repeat_a_silent_one() -> None:
    clock = Clock()
    running = RunningPhases(clock)
    assert running.next_due(30) == 30 and running.due(30) == []  # nothing runs

    assert running.update(PhaseReport(SPEC, Phase.LOADING, process=1)) == f"{SPEC}: loading the model"
    clock.now += 4
    assert (
        running.update(PhaseReport(SPEC, Phase.COMPILING, process=1))
        == f"{SPEC}: compiling the decode step (loading the model took 4s)"
    )
    clock.now += 29
    assert running.due(30) == [] and running.next_due(30) == pytest.approx(1)
    clock.now += 1
    assert running.due(30) == [f"{SPEC}: compiling the decode step for 30s"]
    assert running.due(30) == []  # said: due again 30 s later
    clock.now += 30
    assert running.due(30) == [f"{SPEC}: compiling the decode step for 1m00s"]

    # A step within a phase prints nothing, but the next repeat says it; the next phase says how far it got.
    clock.now += 10
    assert running.update(PhaseReport(SPEC, Phase.DECODING, steps=96, detail="unpadded", process=1)) is not None
    assert (
        running.update(PhaseReport(SPEC, Phase.DECODING, 20.0, step=57, steps=96, detail="unpadded", process=1)) is None
    )
    clock.now += 30
    assert running.due(30) == [f"{SPEC}: decoding: 57/96 steps (unpadded) for 50s"]
    assert running.now_showing() == f"{SPEC}: decoding: 57/96 steps (unpadded) for 50s"  # what a bar shows
    assert running.update(PhaseReport(SPEC, Phase.DECODING, steps=96, detail="left-padded", process=1)) == (
        f"{SPEC}: decoding 96 steps (left-padded) (decoding took 50s, 57/96 steps)"
    )

    # --jobs: each child's spec is named on its own lines; a finished spec is not repeated.
    other = "m/train float32 batch=2 seq=8"
    assert running.update(PhaseReport(other, Phase.TRAINING, steps=2, process=2)) == f"{other}: training 2 steps"
    clock.now += 30
    assert running.due(30) == [f"{SPEC}: decoding 96 steps (left-padded) for 30s", f"{other}: training 2 steps for 30s"]
    assert " | " in running.now_showing()
    running.finished(SPEC)
    clock.now += 30
    assert running.due(30) == [f"{other}: training 2 steps for 1m00s"]

    # The spec claimed again by another worker (its first one died): only the living one is repeated.
    running.update(PhaseReport(other, Phase.LOADING, process=3))
    clock.now += 30
    assert running.due(30) == [f"{other}: loading the model for 30s"]


def test_plain_progress_repeats_a_running_phase_on_its_own_thread_and_stops_when_closed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    progress = LineProgress(total=1, every=0.05)
    progress.phase(PhaseReport(SPEC, Phase.PACKAGING, process=1))
    written = ""
    deadline = time.monotonic() + 30  # waits for the thread's first repeat, however loaded the machine
    while " for " not in written and time.monotonic() < deadline:
        time.sleep(0.02)
        written += capsys.readouterr().err
    progress.advance(SpecOutcome("id", SPEC, Outcome.COMPILED, 1.0, graphs=1))
    progress.close()
    assert not [t for t in threading.enumerate() if t.name == "warmcache-progress"]
    lines = (written + capsys.readouterr().err).splitlines()
    assert lines[0] == f"{SPEC}: building the package"
    assert lines[1].startswith(f"{SPEC}: building the package for ")
    assert lines[-1].startswith(f"[1/1] {SPEC}: compiled in 1.0s")


def test_a_bar_shows_the_running_phase_with_its_time(capsys: pytest.CaptureFixture[str]) -> None:
    bar = BarProgress(total=1, label="warmup")
    bar.phase(PhaseReport(SPEC, Phase.COMPILING, process=1))
    bar.close()
    assert f"{SPEC}: compiling the decode step for 0s" in capsys.readouterr().err


@pytest.mark.slow
def test_a_worker_reports_the_phases_of_real_generate_and_training_specs(
    write_manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    import torch

    from warmcache.identity.plan import plan_manifest
    from warmcache.manifest import load_manifest
    from warmcache.warmup.worker import Worker

    # What the worker sets process-wide, restored after the test: the training workload's variable, the cache folder's,
    # the target's recompile limits.
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "0")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    dynamo = torch._dynamo.config
    path = write_manifest(
        manifest_toml(
            model("m", backend="eager", generate=[generate(prompt_lengths=[8], max_cache_len=16)], train=[train()])
        )
    )
    reports: list[PhaseReport] = []
    worker = Worker(load_manifest(path), tmp_path / "cache", on_phase=reports.append)
    torch._dynamo.reset()
    try:
        with dynamo.patch(
            recompile_limit=dynamo.recompile_limit, accumulated_recompile_limit=dynamo.accumulated_recompile_limit
        ):
            for planned in sorted(plan_manifest(load_manifest(path)), key=lambda p: p.spec.workload):
                worker.run(planned)
    finally:
        torch._dynamo.reset()  # the next test starts with Dynamo as a fresh process has it
    generate_spec, train_spec = sorted({r.spec for r in reports})
    started = [(r.phase, r.detail) for r in reports if r.spec == generate_spec and r.step == 0]
    assert started == [
        (Phase.LOADING, ""),
        (Phase.COMPILING, ""),
        (Phase.DECODING, "unpadded"),
        (Phase.DECODING, "left-padded"),
    ]
    # generate() streamed each form's decode to the cache's end: 16 - 8 + 1 new tokens, the last one reported.
    assert [r.step for r in reports if r.detail and r.step == r.steps] == [9, 9]
    trained = [(r.phase, r.step, r.steps) for r in reports if r.spec == train_spec]
    # the Trainer's last step
    assert trained[:2] == [(Phase.LOADING, 0, 0), (Phase.TRAINING, 0, 2)] and trained[-1] == (
        Phase.TRAINING,
        2,
        2,
    )


@pytest.mark.slow
def test_a_jobs_warmup_shows_each_childs_phases_labelled_by_spec_and_repeats_them(
    write_manifest, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    path = write_manifest(
        manifest_toml(
            model("m", backend="eager", generate=[generate(prompt_lengths=[8], max_cache_len=16)], train=[train()])
        )
    )
    command = [
        sys.executable,
        "-m",
        "warmcache",
        "warmup",
        str(path),
        "--db",
        f"sqlite:///{tmp_path / 'r.sqlite'}",
        "--jobs",
        "2",
        "--progress-every",
        "0.1",
    ]
    # stderr is a pipe: plain output, as in CI
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    generate_spec, train_spec = "m/generate float32 max_cache_len=16 batch=1 seq=8", "m/train float32 batch=2 seq=8"

    def said(spec: str) -> list[str]:
        """What the spec's lines say after its name, repeats left out."""
        return [line[len(spec) + 2 :] for line in lines if line.startswith(f"{spec}: ") and " for " not in line]

    assert said(generate_spec)[0] == "loading the model"
    assert said(generate_spec)[1].startswith("compiling the decode step (loading the model took ")
    assert said(generate_spec)[2].startswith("decoding 9 steps (unpadded) (compiling the decode step took ")
    assert said(generate_spec)[3].startswith("decoding 9 steps (left-padded) (decoding took ") and said(generate_spec)[
        3
    ].endswith(", 9/9 steps)")
    assert said(train_spec)[0] == "loading the model" and said(train_spec)[1].startswith(
        "training 2 steps (loading the model took "
    )
    # The parent repeats a running phase: a compile (the slowest phase, seconds even for a tiny model) outlasts 0.1 s.
    assert any(line.startswith(f"{generate_spec}: compiling the decode step for ") for line in lines)
    assert sum(line.startswith("[") for line in lines) == 2


def test_a_failure_says_the_phase_it_broke_in_and_why_in_one_line() -> None:
    from warmcache.errors import CacheError, SpecFailure
    from warmcache.warmup.phases import Phase, SpecPhases

    phases = SpecPhases("m/generate", None)  # nobody listens: the phase is still known
    phases.enter(Phase.PACKAGING)
    with pytest.raises(SpecFailure) as failed, phases.naming_the_phase():
        raise KeyError("model.model.rotary_emb.inv_freq")
    assert str(failed.value) == "building the package: KeyError: 'model.model.rotary_emb.inv_freq'"
    # warmcache's own errors are such lines already, and some are told apart by type: they pass as they are.
    with pytest.raises(CacheError, match="^aotinductor package: constant x"), phases.naming_the_phase():
        raise CacheError("aotinductor package: constant x is not a parameter or buffer of the loaded model")


@pytest.mark.parametrize(
    ("outcome", "says"),
    [
        (
            SpecOutcome("i", SPEC, Outcome.COMPILED, 38.5, graphs=1, artifacts=37),
            "compiled in 38.5s (1 graph, 37 cache entries)",
        ),
        # "0 graphs, 0 cache entries" read like a shape that did nothing: each zero says why, where it is printed
        (
            SpecOutcome("i", SPEC, Outcome.COMPILED, 0.9, diskless_backend="aot_eager"),
            "compiled in 0.9s (no new graph: reuses one this process compiled for an earlier shape; "
            "no cache entries: aot_eager keeps none on disk)",
        ),
        (
            SpecOutcome("i", SPEC, Outcome.COMPILED, 57.3, artifacts=18, exported=True),
            "compiled in 57.3s (decode step exported to an AOTInductor package, no Dynamo graph, 18 cache entries)",
        ),
        (
            SpecOutcome("i", SPEC, Outcome.COMPILED, 2.0, graphs=1, artifacts=1),
            "compiled in 2.0s (1 graph, 1 cache entry)",
        ),
    ],
    ids=["inductor", "aot_eager reusing a graph", "aotinductor", "one entry"],
)
def test_a_finished_spec_says_what_its_counts_mean(outcome: SpecOutcome, says: str) -> None:
    assert outcome.message() == says
    assert decode(encode(outcome), [SpecOutcome, PhaseReport]) == outcome  # the new fields cross the child protocol
