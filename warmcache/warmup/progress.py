"""What warmup and verify report about each finished spec, and the callback they report to.

The library only reports; ``warmcache.cli.progress`` renders (a bar on a terminal,
plain lines otherwise). What a spec reports *while* it runs is :mod:`warmcache.warmup.phases`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from warmcache.units import format_count
from warmcache.warmup.phases import PhaseReport


class Outcome(StrEnum):
    """How this run finished one claimed spec (what it *did*; the row's state is a
    :class:`~warmcache.registry.statuses.Status`)."""

    COMPILED = "compiled"
    FAILED = "failed"
    LOST = "lost"
    """Compiled, but the claim had expired and another worker took the spec: not recorded."""


@dataclass(frozen=True, slots=True)
class SpecOutcome:
    """One spec this run finished (or failed), for progress lines and the summary."""

    identity: str
    description: str
    status: Outcome
    seconds: float
    graphs: int = 0
    padded_graphs: int = 0
    artifacts: int = 0
    error: str | None = None

    def __post_init__(self) -> None:
        # A child process's message carries the status as text: an unknown one is an error here, not a silent miscount.
        object.__setattr__(self, "status", Outcome(self.status))

    @property
    def failed(self) -> bool:
        return self.status == Outcome.FAILED

    def message(self) -> str:
        if self.failed:
            return f"FAILED after {self.seconds:.1f}s: {self.error}"
        graphs = format_count(self.graphs, "graph")
        if self.padded_graphs:
            graphs += f", {self.padded_graphs} for the padded mask"
        text = f"compiled in {self.seconds:.1f}s ({graphs}, {self.artifacts} cache entries)"
        if self.status == Outcome.LOST:
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


class Finished(Protocol):
    """One finished spec, as progress shows it: a warmup's :class:`SpecOutcome`, a verify's verdict."""

    @property
    def description(self) -> str: ...

    @property
    def failed(self) -> bool: ...

    def message(self) -> str: ...


F_contra = TypeVar("F_contra", bound=Finished, contravariant=True)


class Progress(Protocol[F_contra]):
    """What a run reports each finished spec, and each running spec's phases, to (``warmcache.cli.progress`` renders
    any :class:`Finished`)."""

    def advance(self, finished: F_contra) -> None: ...

    def phase(self, report: PhaseReport) -> None: ...

    def close(self) -> None: ...
