"""The bucket planner's mathematics: exact optimum, batch-maximum distribution, baselines."""

from __future__ import annotations

import bisect
import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmcache.buckets import LengthDistribution, Traffic, plan_by_compile_cost, plan_fixed, suggest_buckets
from warmcache.buckets.baselines import evenly_spaced, powers_of_two, powers_of_two_count, powers_of_two_most


def padding(values: list[int], weights: list, buckets: tuple[int, ...] | list[int]) -> float:
    ordered = sorted(buckets)
    return sum(w * (ordered[bisect.bisect_left(ordered, v)] - v) for v, w in zip(values, weights))


def brute_force(values: list[int], weights: list, max_buckets: int) -> float:
    """Least padding over every subset of at most ``max_buckets`` distinct values that holds the longest."""
    longest, others = values[-1], values[:-1]
    return min(
        padding(values, weights, (*subset, longest))
        for size in range(min(max_buckets, len(values)))
        for subset in itertools.combinations(others, size)
    )


def reference_dp(values: list[int], weights: list, max_buckets: int) -> float:
    """The textbook O(K·n²) recurrence, without the divide-and-conquer speed-up."""
    n = len(values)
    best = [0.0] + [math.inf] * n
    for _ in range(min(max_buckets, n)):
        best = [0.0] + [
            min(best[i] + sum(weights[t] * (values[j - 1] - values[t]) for t in range(i, j)) for i in range(j))
            for j in range(1, n + 1)
        ]
    return best[n]


histograms = st.dictionaries(st.integers(1, 60), st.integers(1, 6), min_size=1, max_size=9)


@settings(max_examples=300, deadline=None)
@given(histograms, st.integers(1, 10))
def test_dp_matches_brute_force_for_single_requests(counts: dict[int, int], k: int) -> None:
    dist = LengthDistribution.from_counts(counts)
    values, weights = list(dist.values), list(dist.counts)
    plan = plan_fixed(values, weights, k)
    assert plan.padding == brute_force(values, weights, k)  # integer weights: exact equality
    assert padding(values, weights, plan.buckets) == plan.padding
    assert plan.buckets[-1] == dist.max_length
    assert len(plan.buckets) <= k and set(plan.buckets) <= set(values)
    assert list(plan.buckets) == sorted(set(plan.buckets))


@settings(max_examples=150, deadline=None)
@given(histograms, st.integers(1, 6), st.integers(2, 8))
def test_dp_matches_brute_force_on_the_batch_maximum(counts: dict[int, int], k: int, batch: int) -> None:
    dist = LengthDistribution.from_counts(counts)
    values, masses = list(dist.values), list(dist.batch_max_masses(batch))
    plan = plan_fixed(values, masses, k)
    assert plan.padding == pytest.approx(brute_force(values, masses, k), rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.integers(1, 400), st.integers(1, 9), min_size=1, max_size=40), st.integers(1, 12))
def test_divide_and_conquer_matches_the_textbook_recurrence_on_larger_instances(counts: dict[int, int], k: int) -> None:
    dist = LengthDistribution.from_counts(counts)
    values, weights = list(dist.values), list(dist.counts)
    assert plan_fixed(values, weights, k).padding == reference_dp(values, weights, k)


@settings(max_examples=150, deadline=None)
@given(histograms, st.integers(0, 200), st.sampled_from([0.5, 1.0, 3.0]))
def test_compile_cost_plan_is_the_global_optimum(counts: dict[int, int], compile_cost: int, scale: float) -> None:
    """Stopping at the first bucket that does not pay for itself is exact because the optimum is convex in K."""
    dist = LengthDistribution.from_counts(counts)
    values, weights = list(dist.values), list(dist.counts)
    plan = plan_by_compile_cost(values, weights, compile_cost=compile_cost, scale=scale)
    best = min(scale * brute_force(values, weights, k) + compile_cost * k for k in range(1, len(values) + 1))
    assert scale * plan.padding + compile_cost * len(plan.buckets) == pytest.approx(best)


def test_compile_cost_extremes() -> None:
    values, weights = [10, 20, 30, 40], [5, 1, 1, 5]
    assert plan_by_compile_cost(values, weights, compile_cost=0).buckets == (10, 20, 30, 40)
    assert plan_by_compile_cost(values, weights, compile_cost=10**9).buckets == (40,)
    assert plan_by_compile_cost(values, weights, compile_cost=0, max_buckets=2).buckets == (10, 40)


def test_batch_max_distribution_by_hand() -> None:
    # F(1) = 1/4, F(2) = 3/4, F(3) = 1; the longest of two: P(1) = 1/16, P(2) = 9/16 - 1/16, P(3) = 1 - 9/16.
    dist = LengthDistribution.from_lengths([1, 2, 2, 3])
    assert dist.batch_max_masses(2) == pytest.approx((1 / 16, 8 / 16, 7 / 16))
    assert dist.batch_max_masses(1) == pytest.approx((1 / 4, 2 / 4, 1 / 4))


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_padded_tokens_per_batch_match_enumerating_every_batch(batch: int) -> None:
    lengths = [1, 2, 2, 3, 7]
    buckets = (2, 7)
    # Every ordered batch of independent draws is equally likely.
    total = Fraction(0)
    batches = list(itertools.product(lengths, repeat=batch))
    for members in batches:
        longest = max(members)
        total += batch * buckets[bisect.bisect_left(buckets, longest)] - sum(members)
    expected = total / len(batches)
    cost = Traffic(LengthDistribution.from_lengths(lengths), batch).cost(buckets)
    assert cost.padded_tokens_per_batch == pytest.approx(float(expected))
    assert cost.padded_tokens_per_request == pytest.approx(float(expected) / batch)
    computed = cost.padded_tokens_per_request + sum(lengths) / len(lengths)
    assert cost.waste_percent == pytest.approx(100 * cost.padded_tokens_per_request / computed)


def test_batched_plan_moves_buckets_towards_the_batch_maximum() -> None:
    """Bucketing single lengths under-serves batches: the batch plan must not pad more on batch traffic."""
    lengths = [8] * 60 + [16] * 25 + [40] * 10 + [64] * 5
    dist = LengthDistribution.from_lengths(lengths)
    batched = Traffic(dist, 8)
    single_plan = plan_fixed(dist.values, dist.counts, 2).buckets
    batch_plan = plan_fixed(dist.values, batched.planner_weights, 2).buckets
    assert single_plan == (16, 64)
    assert batch_plan == (40, 64)
    assert batched.cost(batch_plan).padded_tokens_per_batch < batched.cost(single_plan).padded_tokens_per_batch


def test_single_length_and_more_buckets_than_lengths() -> None:
    assert plan_fixed([512], [3], 4).buckets == (512,)
    plan = plan_fixed([3, 5, 9], [1, 1, 1], 10)
    assert plan.buckets == (3, 5, 9) and plan.padding == 0


def test_ties_give_an_optimal_deterministic_plan() -> None:
    values, weights = [1, 2, 3], [1, 1, 1]  # (1, 3) and (2, 3) both pad one token
    plans = {plan_fixed(values, weights, 2).buckets for _ in range(3)}
    assert len(plans) == 1
    assert padding(values, weights, plans.pop()) == 1


def test_bad_planner_input_is_refused() -> None:
    with pytest.raises(ValueError):
        plan_fixed([1, 2], [1, 1], 0)
    with pytest.raises(ValueError):
        plan_fixed([2, 1], [1, 1], 1)
    with pytest.raises(ValueError):
        LengthDistribution.from_lengths([])
    with pytest.raises(ValueError):
        LengthDistribution.from_lengths([0, 3])


def test_powers_of_two_follow_nxdi() -> None:
    assert powers_of_two(3000) == (128, 256, 512, 1024, 2048, 3000)
    assert powers_of_two(2100) == (128, 256, 512, 1024, 2100)  # round(log2(2100)) = 11: no 2048 next to 2100
    assert powers_of_two(4096, floor=1024) == (1024, 2048, 4096)
    assert powers_of_two(100) == (100,)
    assert powers_of_two_count(4096, 3) == (1024, 2048, 4096)
    assert powers_of_two_count(8, 10) == (1, 2, 4, 8)
    assert powers_of_two_most(8) == 4


def test_evenly_spaced() -> None:
    assert evenly_spaced(10, 3) == (4, 7, 10)
    assert evenly_spaced(4096, 4) == (1024, 2048, 3072, 4096)
    assert evenly_spaced(2, 5) == (1, 2)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.integers(1, 3000), st.integers(1, 20), min_size=2, max_size=30),
    st.integers(1, 6),
    st.integers(1, 4),
)
def test_baselines_never_beat_the_plan_at_equal_k(counts: dict[int, int], k: int, batch: int) -> None:
    suggestion = suggest_buckets(Traffic(LengthDistribution.from_counts(counts), batch), max_buckets=k)
    plan = suggestion.plan
    for strategy in suggestion.strategies[1:]:
        if len(strategy.buckets) <= len(plan.buckets):
            assert plan.cost.padded_tokens_per_request <= strategy.cost.padded_tokens_per_request + 1e-9
        if strategy.buckets_to_match is not None:
            assert strategy.buckets_to_match >= len(plan.buckets)
    assert suggestion.unavoidable.padded_tokens_per_request <= plan.cost.padded_tokens_per_request + 1e-9


def test_default_budget_is_the_powers_of_two_ladder() -> None:
    dist = LengthDistribution.from_lengths([130, 200, 300, 700, 1500, 3000])
    suggestion = suggest_buckets(Traffic(dist))
    assert len(suggestion.buckets) == len(powers_of_two(3000)) == 6
    assert suggestion.buckets == dist.values  # six lengths, six buckets: nothing padded
    assert suggestion.plan.cost.waste_percent == 0
    assert [s.name for s in suggestion.strategies] == [
        "optimal (DP)",
        "powers of two",
        "evenly spaced",
        "powers of two from 128",
    ]


def test_lengths_that_never_lead_a_batch_get_no_bucket() -> None:
    # With 1 short length in 10**6 and batches of 400, P(a batch's longest is 1) = 1e-2400: zero in floats.
    dist = LengthDistribution.from_counts({1: 1, 50: 10**6 - 1, 60: 10**6})
    suggestion = suggest_buckets(Traffic(dist, 400), max_buckets=3)
    assert suggestion.buckets == (50, 60)
