"""Which phase a running spec is in: what warmup and verify report *while* a spec runs.

A real compile takes minutes (an hour on Neuron); a run that says nothing until a
spec is done looks hung. The code that runs a spec (:class:`~warmcache.warmup.worker.Worker`,
the workloads, the package build) enters each phase through a :class:`SpecPhases`,
which hands a :class:`PhaseReport` to a listener: in process, the CLI's renderer
(``warmcache.cli.progress``); in a child process (a ``--jobs`` worker, rank 0 of a
torchrun, verify's replay), the child's report file, which the parent reads and
renders (:mod:`warmcache.warmup.child`). The library reports phase changes and
steps only; a compile has no inner hook, so a phase that stays silent is kept
visible by the renderer's own timer.

Reporting never fails a spec and stays off the hot path: a listener that raises is
dropped (the spec goes on), and steps (one per decoded token) are reported at most
once a second, and always the last one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, TypeVar

from warmcache.artifacts.route import SavePhase
from warmcache.errors import SpecFailure, WarmcacheError, error_line

log = logging.getLogger("warmcache.warmup")

#: Steps within one phase are reported at most this often (plus the last step).
STEP_REPORT_SECONDS = 1.0


class Phase(StrEnum):
    """What a spec is doing; the value is how progress lines say it."""

    LOADING = "loading the model"
    COMPILING = "compiling the decode step"
    """The first short ``generate()`` calls: Dynamo traces the decode step and the backend compiles it (or loads it
    from the cache)."""
    REPLAYING = "replaying the decode step"
    """verify's replay of the same calls: the decode step loads from the compile cache warmup wrote, or, on a backend
    that keeps none, is traced again; "compiling" here read as if verify had compiled what it then reported verified
    with 0 cache misses."""
    FIRST_STEPS = "eager first decode steps"
    """The same calls on the AOTInductor route, whose reference decode is eager: nothing compiles here."""
    DECODING = "decoding"
    """``generate()`` to the cache's end, step by step, under ``fail_on_recompile``."""
    # A precompiled route's save enters these (:class:`warmcache.artifacts.route.SavePhase`).
    PRECOMPILING = SavePhase.PRECOMPILING.value
    EXPORTING = SavePhase.EXPORTING.value
    EXPORTING_PREFILL = SavePhase.EXPORTING_PREFILL.value
    PACKAGING = SavePhase.PACKAGING.value
    """``aoti_compile_and_package``: lowering and the C++ compile."""
    TRAINING = "training"
    PROVING = "proving the decode through warmcache's cache"
    """verify: the decode through warmcache's static cache against the model's own, in a higher-precision copy."""
    PROVING_ARTIFACT = "proving the precompiled artifact"
    """verify: the row's precompiled artifact serves the model's decode."""


@dataclass(frozen=True, slots=True)
class PhaseReport:
    """One spec's phase as it starts, or a step within it (a message of the child protocol too)."""

    spec: str
    """The spec's description, as its result line names it."""
    phase: Phase
    seconds: float = 0.0
    """Seconds in this phase when reported (0 as it starts)."""
    step: int = 0
    steps: int = 0
    """Steps the phase has (0: none to count)."""
    detail: str = ""
    process: int = 0
    """The reporting process: each runs one spec at a time, so its newer report replaces its older one."""

    def __post_init__(self) -> None:
        # A child's message carries the phase as text: an unknown one is an error, not a silent blank.
        object.__setattr__(self, "phase", Phase(self.phase))

    def text(self) -> str:
        """``decoding 96 steps (unpadded)`` as a phase starts, ``decoding: 57/96 steps (unpadded)`` once steps are done.

        A start line saying "0/96" read as if nothing were happening.
        """
        counted = f": {self.step}/{self.steps} steps" if self.step else f" {self.steps} steps"
        text = str(self.phase) + (counted if self.steps else "")
        return text + (f" ({self.detail})" if self.detail else "")


PhaseListener = Callable[[PhaseReport], None]


class SpecPhases:
    """The phases of one spec as it runs: :meth:`enter` each, :meth:`step` within one; reports to ``listener``.

    Without a listener every call is a no-op, so code that runs a spec reports
    unconditionally.
    """

    def __init__(self, spec: str, listener: PhaseListener | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._spec = spec
        self._listener = listener
        self._clock = clock
        self._phase: Phase | None = None
        self._current: PhaseReport | None = None
        self._started = self._reported = 0.0

    def enter(self, phase: Phase | SavePhase, *, steps: int = 0, detail: str = "") -> None:
        phase = Phase(phase)
        self._phase = phase  # known even unheard: a failure names it (:meth:`naming_the_phase`)
        if self._listener is None:
            return
        self._started = self._reported = self._clock()
        self._current = PhaseReport(self._spec, phase, 0.0, 0, steps, detail, os.getpid())
        self._send(self._current)

    def step(self, step: int) -> None:
        """``step`` steps of the current phase are done (reported at most once a second, and always the last)."""
        current = self._current
        if self._listener is None or current is None:
            return
        now = self._clock()
        if step < current.steps and now - self._reported < STEP_REPORT_SECONDS:
            return
        self._reported = now
        self._send(replace(current, step=step, seconds=now - self._started))

    @contextlib.contextmanager
    def naming_the_phase(self) -> Iterator[None]:
        """A failure inside leaves as one line saying where and why: ``building the package: KeyError: 'x'``.

        warmcache's own errors already are such lines (and callers tell some apart by
        type, e.g. a decode that recompiles), so they leave as they are.
        """
        try:
            yield
        except WarmcacheError:
            raise
        except Exception as exc:
            raise SpecFailure(f"{self._phase}: {error_line(exc)}" if self._phase else error_line(exc)) from exc

    def decode_streamer(self) -> DecodeSteps | None:
        """A ``generate(streamer=...)`` reporting each decoded token as a step; ``None`` when nothing listens (no
        streamer, no cost)."""
        return DecodeSteps(self) if self._listener is not None else None

    def _send(self, report: PhaseReport) -> None:
        listener = self._listener
        if listener is None:
            return
        try:
            listener(report)
        except Exception as exc:  # progress is never worth a spec: stop reporting, go on
            log.warning("warmcache: phase reports stopped (%s: %s)", type(exc).__name__, exc)
            self._listener = None


#: What code that runs a spec is handed when nobody listens.
NO_PHASES = SpecPhases("", None)


class DecodeSteps:
    """A duck-typed transformers streamer: ``generate()`` calls :meth:`put` with the prompt, then once per new token.

    A real, public hook of every decoding step (transformers' ``BaseStreamer``
    protocol; no import needed). ``generate()`` refuses a streamer under beam search,
    so callers pass none there.
    """

    def __init__(self, phases: SpecPhases) -> None:
        self._phases = phases
        self._puts = 0

    def put(self, value: Any) -> None:
        if self._puts:  # the first put is the prompt
            self._phases.step(self._puts)
        self._puts += 1

    def end(self) -> None:
        pass


M = TypeVar("M")


def routed(on_message: Callable[[M], None], on_phase: PhaseListener | None) -> Callable[[M | PhaseReport], None]:
    """A child's messages split: phase reports to ``on_phase`` (dropped without one), every other message to
    ``on_message``."""

    def receive(message: M | PhaseReport) -> None:
        if isinstance(message, PhaseReport):
            if on_phase is not None:
                on_phase(message)
        else:
            on_message(message)

    return receive
