"""What each running spec is doing now, as the CLI shows it: the state behind the phase lines and the bar.

Phase reports (:mod:`warmcache.warmup.phases`) arrive on the main thread, from this
process or from its children (several at once under ``--jobs``); a
:class:`Heartbeat` thread reads the same state, because a compile says nothing
for minutes: plain output (CI logs) repeats each running phase with its time
so far, a bar refreshes its clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from warmcache.units import format_duration
from warmcache.warmup.phases import PhaseReport

#: Plain output repeats a running phase after this many seconds of silence (``--progress-every``).
PHASE_LINE_SECONDS = 30.0


@dataclass
class _Running:
    report: PhaseReport
    received: float
    """The clock when the report arrived: its ``seconds`` were true then."""
    shown: float
    """The clock when a line last said this phase."""

    def elapsed(self, now: float) -> str:
        return format_duration(self.report.seconds + now - self.received)

    def line(self, now: float) -> str:
        return f"{self.report.spec}: {self.report.text()} for {self.elapsed(now)}"


def _took(previous: _Running, now: float) -> str:
    """`` (decoding took 14s, 97/97 steps)``."""
    done = f", {previous.report.step}/{previous.report.steps} steps" if previous.report.steps else ""
    return f" ({previous.report.phase} took {previous.elapsed(now)}{done})"


class RunningPhases:
    """Each reporting process's current phase (one spec runs at a time in each), and the lines it is due.

    Thread-safe: updated by the thread that receives reports, read by a heartbeat.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[int, _Running] = {}

    def update(self, report: PhaseReport) -> str | None:
        """Record ``report``; the line to print now when it starts a phase (a step within one prints nothing).

        The line says how long the spec's previous phase took, and how many of its steps
        were done: a log then shows where the time went.
        """
        now = self._clock()
        key = (report.spec, report.phase, report.detail)
        with self._lock:
            before = self._running.get(report.process)
            if before is not None and (before.report.spec, before.report.phase, before.report.detail) == key:
                before.report, before.received = report, now
                return None
            # A spec claimed again after its worker died reports from another process: the dead one's entry goes.
            self._running = {process: r for process, r in self._running.items() if r.report.spec != report.spec}
            self._running[report.process] = _Running(report, now, now)
        return f"{report.spec}: {report.text()}" + (
            _took(before, now) if before is not None and before.report.spec == report.spec else ""
        )

    def finished(self, spec: str) -> None:
        """The spec's result arrived: it runs no more."""
        with self._lock:
            self._running = {process: r for process, r in self._running.items() if r.report.spec != spec}

    def due(self, every: float) -> list[str]:
        """A line for each phase nothing has said for ``every`` seconds, with its time so far."""
        now = self._clock()
        with self._lock:
            stale = [r for r in self._running.values() if now - r.shown >= every]
            for running in stale:
                running.shown = now
            return [r.line(now) for r in stale]

    def next_due(self, every: float) -> float:
        """Seconds until the next line is due, when each phase is said again after ``every`` silent seconds
        (``every`` while nothing runs)."""
        now = self._clock()
        with self._lock:
            return max(0.0, min((r.shown + every - now for r in self._running.values()), default=every))

    def now_showing(self) -> str:
        """Every running phase with its time so far, in one line (``""`` while nothing runs)."""
        now = self._clock()
        with self._lock:
            return " | ".join(r.line(now) for r in self._running.values())


class Heartbeat:
    """Calls ``beat`` on a daemon thread each time ``wait()`` seconds pass, from :meth:`start` until :meth:`close`."""

    def __init__(self, beat: Callable[[], None], wait: Callable[[], float]) -> None:
        self._beat = beat
        self._wait = wait
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start beating (again calls do nothing): on the first phase, so a run with nothing to compile starts no
        thread."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="warmcache-progress", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._wait()):
            try:
                self._beat()
            except Exception:  # stderr gone (a closed pipe): stop repeating; the run itself goes on
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
