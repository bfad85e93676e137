"""How the CLI shows long work: a tqdm bar on a terminal, plain lines otherwise (CI logs stay readable).

The library reports through callbacks (``update(done, total)``, a warmup
:class:`~warmcache.warmup.progress.Progress`); only this module renders them,
always on stderr, so ``--json`` output on stdout stays machine-readable.

While a spec runs, its phases (:mod:`warmcache.warmup.phases`) show too: on the
bar, with their time so far; in plain output, a line as each phase starts and
again whenever one has been silent for ``every`` seconds, so a CI log of an
hour-long compile never looks hung.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click
from tqdm import tqdm

from warmcache.cli.interrupted import note_left
from warmcache.cli.running import PHASE_LINE_SECONDS, Heartbeat, RunningPhases
from warmcache.warmup.phases import PhaseReport
from warmcache.warmup.progress import Finished, Progress

#: How often a bar's clock of the running phases moves.
BAR_REFRESH_SECONDS = 1.0


class LineProgress:
    """``[3/12] tiny-qwen3 generate batch=2 seq=16: compiled in 4.1s (1 graph, 3 cache entries)``, and the phases before
    it.

    ``tiny-qwen3/generate ... seq=16: compiling the decode step`` as a phase starts;
    ``...: compiling the decode step for 30s`` each ``every`` seconds it goes on.
    """

    def __init__(self, total: int, every: float = PHASE_LINE_SECONDS) -> None:
        self.total = total
        self.done = 0
        self._every = every
        self._running = RunningPhases()
        self._heartbeat = Heartbeat(self._repeat, lambda: self._running.next_due(every))

    def advance(self, finished: Finished) -> None:
        self._running.finished(finished.description)
        self.done += 1
        click.echo(f"[{self.done}/{self.total}] {finished.description}: {finished.message()}", err=True)

    def phase(self, report: PhaseReport) -> None:
        line = self._running.update(report)
        if line is not None:
            click.echo(line, err=True)
        self._heartbeat.start()

    def _repeat(self) -> None:
        for line in self._running.due(self._every):
            click.echo(line, err=True)

    def close(self) -> None:
        self._heartbeat.close()


class BarProgress:
    """A bar naming the running specs' phases (or the last finished spec); failures are written above it."""

    def __init__(self, total: int, label: str) -> None:
        self.total = total
        self.done = 0
        self._bar = tqdm(total=total, desc=label, unit="spec", file=sys.stderr, dynamic_ncols=True)
        self._running = RunningPhases()
        self._heartbeat = Heartbeat(self._show_running, lambda: BAR_REFRESH_SECONDS)

    def advance(self, finished: Finished) -> None:
        self._running.finished(finished.description)
        if finished.failed:
            self._bar.write(f"{finished.description}: {finished.message()}", file=sys.stderr)
        self._bar.set_postfix_str(f"{finished.description}: {finished.message()}", refresh=False)
        self.done += 1
        self._bar.update(1)

    def phase(self, report: PhaseReport) -> None:
        self._running.update(report)
        self._show_running()
        self._heartbeat.start()

    def _show_running(self) -> None:
        if text := self._running.now_showing():
            self._bar.set_postfix_str(text)

    def close(self) -> None:
        self._heartbeat.close()
        self._bar.close()


def spec_progress(total: int, *, terminal: bool, label: str, every: float = PHASE_LINE_SECONDS) -> Progress[Finished]:
    """What a warmup or verify reports each running spec's phases and each finished spec to (``every``: plain
    output's repeat); an interruption meanwhile says how many specs it left (:func:`note_left`)."""
    shown = BarProgress(total, label) if terminal else LineProgress(total, every)
    note_left(
        lambda: (
            f"{shown.done} of {shown.total} specs finished and recorded, {shown.total - shown.done} left; "
            "run it again to go on"
        )
    )
    return shown


@contextmanager
def amount_progress(
    label: str, *, terminal: bool, steps: int, line: Callable[[int, int], str], unit: str = "it"
) -> Iterator[Callable[[int, int], None]]:
    """An ``update(done, total)`` callback: a bar on a terminal, else a plain line each ``1/steps`` of the total (and at
    the end).

    ``unit="B"`` shows bytes with binary prefixes on the bar.
    """
    if terminal:
        bar = tqdm(
            total=1,
            desc=label,
            unit=unit,
            unit_scale=unit == "B",
            unit_divisor=1024,
            file=sys.stderr,
            dynamic_ncols=True,
        )

        def advance(done: int, total: int) -> None:
            bar.total = max(total, 1)
            bar.update(done - bar.n)

        try:
            yield advance
        finally:
            bar.close()
        return
    reported = -1

    def report(done: int, total: int) -> None:
        nonlocal reported
        step = steps * done // max(total, 1)
        if step > reported:
            reported = step
            click.echo(line(done, total), err=True)

    yield report
