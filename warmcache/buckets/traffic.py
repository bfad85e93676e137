"""What a set of buckets costs on given traffic: the one definition of padded tokens.

A batch of ``N`` requests with lengths ``L_1..L_N`` runs in the smallest bucket
``b`` that holds its longest member ``M``; it computes ``N * b`` tokens of which
``N * b - sum(L_i)`` are padding. Averaged over independent draws:

* padded tokens per batch   = ``N * (E[b(M)] - E[L])``
* padded tokens per request = ``E[b(M)] - E[L]``
* waste %                   = padded / computed = ``(E[b(M)] - E[L]) / E[b(M)]``

``N = 1`` is single-request serving (``M = L``). Bucket choice can only change
``E[b(M)]``; the padding a batch needs anyway (up to its own longest member) is
counted too, so waste is never zero for ``N > 1`` with varied lengths.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from warmcache.buckets.distribution import LengthDistribution


@dataclass(frozen=True, slots=True)
class Cost:
    """Padding of one bucket set on one traffic."""

    buckets: tuple[int, ...]
    expected_bucket: float
    padded_tokens_per_request: float
    padded_tokens_per_batch: float
    waste_percent: float


@dataclass(frozen=True)
class Traffic:
    """Observed lengths, served ``batch_size`` requests at a time."""

    lengths: LengthDistribution
    batch_size: int = 1

    @cached_property
    def planner_weights(self) -> tuple[int, ...] | tuple[float, ...]:
        """The weight of each distinct length as a batch maximum.

        Single requests keep their integer counts, so the planner's arithmetic is exact.
        """
        if self.batch_size == 1:
            return self.lengths.counts
        return self.lengths.batch_max_masses(self.batch_size)

    @cached_property
    def _total_weight(self) -> float:
        return sum(self.planner_weights)

    def cost(self, buckets: Sequence[int]) -> Cost:
        """Padding when every batch runs in the smallest of ``buckets`` holding its longest member."""
        ordered = tuple(sorted(buckets))
        if not ordered or ordered[-1] < self.lengths.max_length:
            raise ValueError(f"buckets {ordered} do not hold the longest length {self.lengths.max_length}")
        weights = self.planner_weights
        expected = (
            sum(w * ordered[bisect.bisect_left(ordered, v)] for v, w in zip(self.lengths.values, weights))
            / self._total_weight
        )
        per_request = max(expected - self.lengths.mean_length, 0.0)  # clamp float noise at exact fits
        return Cost(
            buckets=ordered,
            expected_bucket=expected,
            padded_tokens_per_request=per_request,
            padded_tokens_per_batch=per_request * self.batch_size,
            waste_percent=100.0 * per_request / expected,
        )
