"""Observed sequence lengths, and the distribution of the length a compiled bucket must hold.

A single request is padded up to a bucket that holds its own length. A batch of
``N`` requests is padded up to a bucket that holds its *longest* member, so for
batched serving the distribution that matters is the one of the batch maximum
``M = max(L_1, ..., L_N)``. With the lengths drawn independently from the
empirical distribution ``F``, ``P(M <= x) = F(x) ** N``: a batch is much more
likely to need a long bucket than a single request is, which is why bucketing
on single lengths under-provisions long buckets for batched serving.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """Distinct observed lengths (ascending) with how often each was seen.

    ``counts`` are weights, usually request counts (integers keep the planner's
    arithmetic exact); they need not sum to anything in particular.
    """

    values: tuple[int, ...]
    counts: tuple[int, ...]

    @classmethod
    def from_lengths(cls, lengths: Iterable[int]) -> LengthDistribution:
        return cls.from_counts(Counter(lengths))

    @classmethod
    def from_counts(cls, counts: Mapping[int, int]) -> LengthDistribution:
        """``{length: count}``; zero counts are dropped, negative counts or lengths < 1 refused."""
        kept = {length: count for length, count in counts.items() if count}
        if not kept:
            raise ValueError("a length distribution needs at least one length")
        if any(length < 1 for length in kept) or any(count < 0 for count in kept.values()):
            raise ValueError("lengths must be >= 1 and counts >= 0")
        values = tuple(sorted(kept))
        return cls(values, tuple(kept[v] for v in values))

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def min_length(self) -> int:
        return self.values[0]

    @property
    def max_length(self) -> int:
        return self.values[-1]

    @property
    def mean_length(self) -> float:
        return sum(v * c for v, c in zip(self.values, self.counts)) / self.total

    def batch_max_masses(self, batch_size: int) -> tuple[float, ...]:
        """``P(max of batch_size independent draws == values[i])`` for each distinct value.

        ``batch_size == 1`` gives the plain normalised histogram.
        """
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        total = self.total
        masses: list[float] = []
        below = 0.0  # F(previous value) ** batch_size
        running = 0
        for count in self.counts:
            running += count
            at_or_below = (running / total) ** batch_size
            masses.append(at_or_below - below)
            below = at_or_below
        return tuple(masses)
