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
    #: The backend, when it keeps no compile cache on disk (eager, aot_eager): why the spec wrote no cache entries.
    diskless_backend: str | None = None
    #: Its decode step was exported to an AOTInductor package: why Dynamo compiled no graph.
    exported: bool = False

    def __post_init__(self) -> None:
        # A child process's message carries the status as text: an unknown one is an error here, not a silent miscount.
        object.__setattr__(self, "status", Outcome(self.status))

    @property
    def failed(self) -> bool:
        return self.status == Outcome.FAILED

    def message(self) -> str:
        if self.failed:
            return f"FAILED after {self.seconds:.1f}s: {self.error}"
        # Each part says what a zero means where it is printed: a reader of "0 graphs, 0 cache entries" would
        # otherwise take a warmed shape for one that did nothing.
        if self.graphs:
            graphs = format_count(self.graphs, "graph")
        elif self.exported:
            graphs = "decode step exported to an AOTInductor package, no Dynamo graph"
        else:
            graphs = "no new graph: reuses one this process compiled for an earlier shape"
        if self.padded_graphs:
            graphs += f", {self.padded_graphs} for the padded mask"
        if self.diskless_backend:
            entries = f"; no cache entries: {self.diskless_backend} keeps none on disk"
        else:
            entries = f", {self.artifacts} cache {'entry' if self.artifacts == 1 else 'entries'}"
        text = f"compiled in {self.seconds:.1f}s ({graphs}{entries})"
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
            "diskless_backend": self.diskless_backend,
            "exported": self.exported,
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
