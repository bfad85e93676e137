"""Claim specs in a fixed order (longest first) without rescanning the ones already taken.

A fleet of hundreds of workers over a manifest of thousands of specs claims about
once per compile each. Asking the registry for "the first claimable spec among
all 10,000" every time makes each claim cost more as the run goes on; instead a
worker keeps its place in the ordered list and asks about a small window at a
time, moving on once a window has nothing left to claim. Specs that become
claimable again behind the cursor (a dead worker's expired lease, a released
claim) are found when the worker reaches the end: it narrows its list to the
specs still pending or compiling anywhere and starts again from the top.
"""

from __future__ import annotations

from collections.abc import Sequence

from warmcache.registry import Registry, ShapeRecord

#: Identities one claim asks about; the order within the window is kept too.
WINDOW = 256


class ClaimQueue:
    """One worker's place in the ordered list of specs it may claim."""

    def __init__(self, registry: Registry, identities: Sequence[str], worker: str, lease_seconds: float) -> None:
        self._registry = registry
        self._worker = worker
        self._lease_seconds = lease_seconds
        self._open = list(identities)
        self._start = 0

    def claim(self) -> ShapeRecord | None:
        """The first claimable spec from the cursor on, in order; ``None`` once the end is reached."""
        while self._start < len(self._open):
            window = self._open[self._start : self._start + WINDOW]
            record = self._registry.claim(window, self._worker, self._lease_seconds)
            if record is not None:
                return record
            self._start += WINDOW
        return None

    def narrow(self) -> bool:
        """Keep the specs still pending or compiling (anywhere) and go back to the top; ``False`` if none is left."""
        still = self._registry.unfinished(self._open)
        self._open = [identity for identity in self._open if identity in still]
        self._start = 0
        return bool(self._open)
