"""How the CLI shows long work: a tqdm bar on a terminal, plain lines otherwise (CI logs stay readable).

The library reports through callbacks (``update(done, total)``, a warmup
:class:`~warmcache.warmup.progress.Progress`); only this module renders them,
always on stderr, so ``--json`` output on stdout stays machine-readable.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click
from tqdm import tqdm

from warmcache.warmup.progress import Finished, Progress


class LineProgress:
    """``[3/12] tiny-qwen3 generate batch=2 seq=16: compiled in 4.1s (1 graph, 3 cache entries)``."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0

    def advance(self, finished: Finished) -> None:
        self.done += 1
        click.echo(f"[{self.done}/{self.total}] {finished.description}: {finished.message()}", err=True)

    def close(self) -> None:
        pass


class BarProgress:
    """A bar naming the last finished spec; failures are written above it."""

    def __init__(self, total: int, label: str) -> None:
        self._bar = tqdm(total=total, desc=label, unit="spec", file=sys.stderr, dynamic_ncols=True)

    def advance(self, finished: Finished) -> None:
        if finished.failed:
            self._bar.write(f"{finished.description}: {finished.message()}", file=sys.stderr)
        self._bar.set_postfix_str(f"{finished.description}: {finished.message()}", refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def spec_progress(total: int, *, terminal: bool, label: str) -> Progress[Finished]:
    """What a warmup or verify reports each finished spec to."""
    return BarProgress(total, label) if terminal else LineProgress(total)


@contextmanager
def amount_progress(label: str, *, terminal: bool, steps: int, line: Callable[[int, int], str], unit: str = "it") -> Iterator[Callable[[int, int], None]]:
    """An ``update(done, total)`` callback: a bar on a terminal, else a plain line each ``1/steps`` of the total (and at the end).

    ``unit="B"`` shows bytes with binary prefixes on the bar.
    """
    if terminal:
        bar = tqdm(total=1, desc=label, unit=unit, unit_scale=unit == "B", unit_divisor=1024, file=sys.stderr, dynamic_ncols=True)

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
