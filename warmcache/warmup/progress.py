"""Show warmup progress: a bar on a terminal, one plain line per spec otherwise (CI logs).

Both go to stderr, so ``--json`` output on stdout stays machine-readable.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Protocol

import click

from warmcache.statuses import Status


@dataclass(frozen=True, slots=True)
class SpecOutcome:
    """One spec this run finished (or failed), for progress lines and the summary."""

    identity: str
    description: str
    status: str  # compiled | failed | lost (the claim expired and another worker took the spec)
    seconds: float
    graphs: int = 0
    padded_graphs: int = 0
    artifacts: int = 0
    error: str | None = None

    def message(self) -> str:
        if self.status == Status.FAILED:
            return f"FAILED after {self.seconds:.1f}s: {self.error}"
        graphs = f"{self.graphs} graph{'s' if self.graphs != 1 else ''}"
        if self.padded_graphs:
            graphs += f", {self.padded_graphs} for the padded mask"
        text = f"compiled in {self.seconds:.1f}s ({graphs}, {self.artifacts} cache entries)"
        if self.status == "lost":
            text += "; claim lost to another worker, not recorded"
        return text

    def as_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "spec": self.description,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "graphs": self.graphs,
            "padded_graphs": self.padded_graphs,
            "artifacts": self.artifacts,
            "error": self.error,
        }


class Progress(Protocol):
    def advance(self, outcome: SpecOutcome) -> None: ...

    def close(self) -> None: ...


class LineProgress:
    """``[3/12] tiny-qwen3 generate batch=2 seq=16: compiled in 4.1s (1 graph, 3 cache entries)``."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0

    def advance(self, outcome: SpecOutcome) -> None:
        self.done += 1
        click.echo(f"[{self.done}/{self.total}] {outcome.description}: {outcome.message()}", err=True)

    def close(self) -> None:
        pass


class BarProgress:
    """A click progress bar naming the last finished spec; failures are echoed above it."""

    def __init__(self, total: int) -> None:
        self._last = ""
        self._bar: click._termui_impl.ProgressBar[int] = click.progressbar(length=total, label="warmup", file=sys.stderr, item_show_func=lambda _: self._last)
        self._bar.__enter__()

    def advance(self, outcome: SpecOutcome) -> None:
        if outcome.status == Status.FAILED:
            click.echo(f"\n{outcome.description}: {outcome.message()}", err=True)
        self._last = f"{outcome.description}: {outcome.status} {outcome.seconds:.1f}s"
        self._bar.update(1)

    def close(self) -> None:
        self._bar.__exit__(None, None, None)


def progress_for(total: int, *, terminal: bool) -> Progress:
    return BarProgress(total) if terminal else LineProgress(total)
