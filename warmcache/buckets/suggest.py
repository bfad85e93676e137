"""Suggest bucket lengths for some traffic, side by side with the usual ladders.

Two ways to say how many buckets to compile:

* ``max_buckets=K``: the least padding with at most K buckets;
* ``compile_cost=C``: minimise ``R * padded_tokens_per_request + C * K``, where
  ``R`` is the number of requests the buckets will serve (``expected_requests``,
  by default the number of observed lengths) and ``C`` is what one more compiled
  bucket is worth in padded tokens (e.g. a compile's device-minutes divided by
  the device-minutes one padded token costs over the deployment's life).

With neither, the plan gets the bucket count of the powers-of-two ladder from
``pow2_floor``: the same compile budget as NxDI's default, spent optimally.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from warmcache.buckets.baselines import (
    DEFAULT_POW2_FLOOR,
    evenly_spaced,
    powers_of_two,
    powers_of_two_count,
    powers_of_two_most,
)
from warmcache.buckets.planner import plan_by_compile_cost, plan_fixed
from warmcache.buckets.traffic import Cost, Traffic

#: How far "buckets needed to match the plan" searches for evenly spaced ladders.
MATCH_SEARCH_LIMIT = 1024

#: Relative slack when comparing float paddings (batched weights are floats).
_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class Strategy:
    """One way of choosing buckets, its padding, and how many buckets it needs to pad no more than the plan.

    ``buckets_to_match`` is ``None`` when no size of that family gets there
    (within :data:`MATCH_SEARCH_LIMIT` buckets).
    """

    name: str
    cost: Cost
    buckets_to_match: int | None

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.cost.buckets


@dataclass(frozen=True, slots=True)
class Suggestion:
    """The plan and the strategies it is compared with (the plan first).

    ``unavoidable`` is the padding with every observed length compiled: what
    batching costs whatever the buckets (zero for single requests).
    """

    traffic: Traffic
    strategies: tuple[Strategy, ...]
    unavoidable: Cost
    compile_cost: float | None
    expected_requests: int
    planner_seconds: float

    @property
    def plan(self) -> Strategy:
        return self.strategies[0]

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.plan.buckets


def suggest_buckets(
    traffic: Traffic,
    *,
    max_buckets: int | None = None,
    compile_cost: float | None = None,
    expected_requests: int | None = None,
    pow2_floor: int = DEFAULT_POW2_FLOOR,
) -> Suggestion:
    """Plan buckets for ``traffic`` and compare with powers of two and evenly spaced ladders.

    :param traffic: the observed lengths (and batch sizes) to serve.
    :param max_buckets: the least padding with at most this many buckets.
    :param compile_cost: what one more compiled bucket is worth in padded tokens: the plan minimises
        ``expected_requests * padded tokens per request + compile_cost * buckets``.
    :param expected_requests: how many requests the buckets will serve (default: the number of observed lengths).
    :param pow2_floor: the smallest bucket of the powers-of-two ladder; with neither ``max_buckets`` nor
        ``compile_cost``, the plan gets as many buckets as that ladder has.
    :returns: the plan first, then the ladders it is compared with, each with its padding.
    """
    lengths = traffic.lengths
    longest = lengths.max_length
    requests = expected_requests if expected_requests is not None else lengths.total
    # A short length can be (numerically) never a large batch's longest member: a bucket there would serve nothing.
    kept = [(value, weight) for value, weight in zip(lengths.values, traffic.planner_weights) if weight > 0]
    values, weights = [v for v, _ in kept], [w for _, w in kept]
    started = time.perf_counter()
    if compile_cost is not None:
        plan = plan_by_compile_cost(
            values, weights, compile_cost=compile_cost, scale=requests / sum(weights), max_buckets=max_buckets
        )
    else:
        budget = max_buckets if max_buckets is not None else len(powers_of_two(longest, pow2_floor))
        plan = plan_fixed(values, weights, budget)
    elapsed = time.perf_counter() - started

    k = len(plan.buckets)
    target = traffic.cost(plan.buckets).padded_tokens_per_request

    def strategy(name: str, buckets: tuple[int, ...], family: Callable[[int], tuple[int, ...]], most: int) -> Strategy:
        return Strategy(name, traffic.cost(buckets), _buckets_to_match(traffic, family, most, target))

    def pow2(count: int) -> tuple[int, ...]:
        return powers_of_two_count(longest, count)

    def even(count: int) -> tuple[int, ...]:
        return evenly_spaced(longest, count)

    even_most = min(longest, MATCH_SEARCH_LIMIT)
    strategies = (
        Strategy("optimal (DP)", traffic.cost(plan.buckets), k),
        strategy("powers of two", pow2(k), pow2, powers_of_two_most(longest)),
        strategy("evenly spaced", even(k), even, even_most),
        strategy(
            f"powers of two from {pow2_floor}", powers_of_two(longest, pow2_floor), pow2, powers_of_two_most(longest)
        ),
    )
    return Suggestion(traffic, strategies, traffic.cost(lengths.values), compile_cost, requests, elapsed)


def _buckets_to_match(
    traffic: Traffic, family: Callable[[int], tuple[int, ...]], most: int, target: float
) -> int | None:
    """The fewest buckets of ``family`` padding no more than ``target`` tokens per request."""
    allowed = target * (1 + _TOLERANCE) + _TOLERANCE
    for count in range(1, most + 1):
        if traffic.cost(family(count)).padded_tokens_per_request <= allowed:
            return count
    return None
