"""Progress inside a spec: the phases a running spec reports (warmcache.warmup.phases) and how the CLI shows them (warmcache.cli.running).

The reporting and rendering logic is tested on an explicit clock, so nothing here
waits for a timer to prove a line is due; the real runs (a Worker on a tiny
model, a ``--jobs`` warmup through child processes) prove that real
``generate()``, the real Trainer and the child protocol carry the phases.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from manifests import generate, manifest_toml, model, train

from warmcache.warmup.phases import STEP_REPORT_SECONDS, Phase, PhaseReport, SpecPhases

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


@pytest.mark.slow
def test_a_worker_reports_the_phases_of_real_generate_and_training_specs(write_manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import torch

    from warmcache.manifest import load_manifest
    from warmcache.plan import plan_manifest
    from warmcache.warmup.worker import Worker

    # What the worker sets process-wide, restored after the test: the training workload's variable, the cache folder's, the target's recompile limits.
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "0")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    dynamo = torch._dynamo.config
    path = write_manifest(manifest_toml(model("m", backend="eager", generate=[generate(prompt_lengths=[8], max_cache_len=16)], train=[train()])))
    reports: list[PhaseReport] = []
    worker = Worker(load_manifest(path), tmp_path / "cache", on_phase=reports.append)
    torch._dynamo.reset()
    try:
        with dynamo.patch(recompile_limit=dynamo.recompile_limit, accumulated_recompile_limit=dynamo.accumulated_recompile_limit):
            for planned in sorted(plan_manifest(load_manifest(path)), key=lambda p: p.spec.workload):
                worker.run(planned)
    finally:
        torch._dynamo.reset()  # the next test starts with Dynamo as a fresh process has it
    generate_spec, train_spec = sorted({r.spec for r in reports})
    started = [(r.phase, r.detail) for r in reports if r.spec == generate_spec and r.step == 0]
    assert started == [(Phase.LOADING, ""), (Phase.COMPILING, ""), (Phase.DECODING, "unpadded"), (Phase.DECODING, "left-padded")]
    # generate() streamed each form's decode to the cache's end: 16 - 8 + 1 new tokens, the last one reported.
    assert [r.step for r in reports if r.detail and r.step == r.steps] == [9, 9]
    trained = [(r.phase, r.step, r.steps) for r in reports if r.spec == train_spec]
    assert trained[:2] == [(Phase.LOADING, 0, 0), (Phase.TRAINING, 0, 2)] and trained[-1] == (Phase.TRAINING, 2, 2)  # the Trainer's last step
