"""Claim specs in a fixed order (longest first) without rescanning the ones already taken.

A fleet of hundreds of workers over a manifest of thousands of specs claims about
once per compile each. Asking the registry for "the first claimable spec among
all 10,000" every time makes each claim cost more as the run goes on; instead a
worker keeps its place in the ordered list and asks about a small window at a
time, moving on once a window has nothing left to claim. Specs that become
claimable again behind the cursor (a dead worker's expired lease, a released
claim) are found when the worker reaches the end: it narrows its list to the
specs still pending or compiling anywhere and starts again from the top.

Short specs are claimed several at a time, up to ``batch_seconds`` of expected
compile time, so a worker asks the registry about as often as its heartbeat
renews a lease however short its specs are: the end of a longest-first run,
where every worker runs the shortest specs, or a re-warm whose compiles are
cache hits, would otherwise have each worker claim every second or two. Each
batch's budget is drawn between half and all of ``batch_seconds``: workers whose
batches began together would otherwise all finish, and claim, together. A batch
never takes more than ``1 / TAIL_SHARES`` of the expected work left in the list
(guided self-scheduling), so a few workers finishing a small manifest share its
last specs instead of one of them taking them all.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from warmcache.registry import Registry, ShapeRecord

#: Identities one claim asks about; the order within the window is kept too.
WINDOW = 256
#: The most specs one claim takes, however short they are expected to be.
MOST_AT_ONCE = 32
#: A batch takes at most this share of the expected work left in the list (1/8).
TAIL_SHARES = 8


class ClaimQueue:
    """One worker's place in the ordered list of specs it may claim."""

    def __init__(
        self,
        registry: Registry,
        identities: Sequence[str],
        worker: str,
        lease_seconds: float,
        expected: Mapping[str, float] | None = None,
        batch_seconds: float = 0.0,
    ) -> None:
        self._registry = registry
        self._worker = worker
        self._lease_seconds = lease_seconds
        self._expected = expected or {}
        self._batch_seconds = batch_seconds
        self._random = random.Random()
        #: How much slower than expected the last batch ran (at least 1): later batches shrink by it.
        self._pace = 1.0
        self._open = list(identities)
        self._left = self._work_left()
        self._start = 0
        #: Just past the last spec this worker claimed: where the claimable ones most likely begin.
        self._next = 0

    def claim(self) -> list[ShapeRecord]:
        """The first claimable specs from the cursor on, in order (several if short); ``[]`` once the end is reached."""
        while self._start < len(self._open):
            window = self._open[self._start : self._start + WINDOW]
            records = self._registry.claim_batch(window, self._worker, self._lease_seconds, self._how_many())
            if records:
                self._next = self._start + window.index(records[-1].identity) + 1
                return records
            self._start += WINDOW
        return []

    def _how_many(self) -> int:
        """As many specs as fit ``batch_seconds``, judged by the first spec not yet claimed here: the list is longest
        first.

        A spec with no expected time (which the order puts first) is claimed alone. The
        estimate can be off (a longer spec given back earlier in the window, a compile
        slower than its history): a batch that runs long stops starting specs (see
        :func:`warmcache.warmup.claims.run_claimed`).
        """
        position = max(self._start, self._next)
        seconds = self._expected.get(self._open[position]) if position < len(self._open) else None
        if not seconds:
            return 1
        budget = (
            min(self._batch_seconds * self._random.uniform(0.5, 1.0), self._left[position] / TAIL_SHARES) / self._pace
        )
        return max(1, min(MOST_AT_ONCE, int(budget // seconds)))

    def observe(self, seconds: Mapping[str, float]) -> None:
        """What the last batch's specs took: expected times that were too short (a cache hit recorded, a slower host)
        shrink later batches."""
        expected = sum(self._expected.get(identity, 0.0) for identity in seconds)
        if expected > 0:
            self._pace = max(
                1.0, sum(took for identity, took in seconds.items() if identity in self._expected) / expected
            )

    def _work_left(self) -> list[float]:
        """The expected seconds from each position of the list to its end (unknown specs count as none)."""
        left = [0.0] * (len(self._open) + 1)
        for i in range(len(self._open) - 1, -1, -1):
            left[i] = left[i + 1] + self._expected.get(self._open[i], 0.0)
        return left

    def narrow(self) -> bool:
        """Keep the specs still pending or compiling (anywhere) and go back to the top; ``False`` if none is left."""
        still = self._registry.unfinished(self._open)
        self._open = [identity for identity in self._open if identity in still]
        self._left = self._work_left()
        self._start = self._next = 0
        return bool(self._open)
