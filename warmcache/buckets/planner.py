"""Exact minimum-padding bucket lengths, by dynamic programming.

The problem: distinct lengths ``v_1 < ... < v_n`` occur with weights ``w_i``
(request counts, or the probability that a batch's longest member is ``v_i``).
Choose at most ``K`` bucket lengths, the largest equal to ``v_n`` so that every
observed length fits; each length is padded to the smallest bucket that holds
it. Minimise the weighted padding ``sum_i w_i * (bucket(v_i) - v_i)``.

An optimal bucket set only uses observed lengths (lowering a bucket to the
longest length it serves never adds padding), so a plan is a split of the sorted
values into ``K`` contiguous groups, each padded to its last value. With prefix
sums a group's cost is O(1), and ``f_k(j) = min_i f_{k-1}(i) + cost(i, j)`` is
the classic O(K·n²) recurrence. The group cost satisfies the quadrangle
inequality (``cost(a,d) + cost(b,c) - cost(a,c) - cost(b,d) =
(v_d - v_c)(W_b - W_a) >= 0``), so the best split point is monotone in ``j`` and
each layer is solved by divide and conquer in O(n log n): O(K·n·log n) overall,
still exact. The same property makes the optimum convex in ``K`` (Aggarwal,
Schieber and Tokuyama, 1994), which is what lets :func:`plan_by_compile_cost`
stop adding buckets as soon as one more bucket saves less than it costs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Weight = int | float


@dataclass(frozen=True, slots=True)
class Plan:
    """The chosen bucket lengths and their weighted padding (in the weights' units)."""

    buckets: tuple[int, ...]
    padding: Weight


class _SplitProgram:
    """The DP over splits of the sorted values, one bucket count (layer) at a time.

    Layers are kept so that any computed bucket count can be reconstructed, which
    the compile-cost search needs after it has looked one layer past its answer.
    """

    def __init__(self, values: Sequence[int], weights: Sequence[Weight]) -> None:
        if not values or len(values) != len(weights):
            raise ValueError("need as many weights as values, and at least one value")
        if any(b <= a for a, b in zip(values, values[1:])):
            raise ValueError("values must be distinct and ascending")
        self.values = list(values)
        self.prefix_weight: list[Weight] = [0]
        self.prefix_tokens: list[Weight] = [0]
        for value, weight in zip(values, weights):
            self.prefix_weight.append(self.prefix_weight[-1] + weight)
            self.prefix_tokens.append(self.prefix_tokens[-1] + weight * value)
        n = len(values)
        # best[k][j]: least padding of values[:j] with k buckets; split[k][j]: where its last group starts.
        self.best: list[list[Weight]] = [[0] + [math.inf] * n]
        self.split: list[list[int]] = [[0] * (n + 1)]

    @property
    def max_buckets(self) -> int:
        return len(self.values)

    @property
    def layers(self) -> int:
        return len(self.best) - 1

    def padding(self, buckets: int) -> Weight:
        """Least padding with exactly ``buckets`` buckets (computed layers only)."""
        return self.best[buckets][len(self.values)]

    def extend(self) -> Weight:
        """Compute the next layer (one more bucket); return its least padding."""
        k = self.layers + 1
        if k > self.max_buckets:
            raise ValueError(f"cannot use more buckets ({k}) than distinct lengths ({self.max_buckets})")
        n = len(self.values)
        previous = self.best[-1]
        current: list[Weight] = [math.inf] * (n + 1)
        split = [0] * (n + 1)
        values, weight, tokens = self.values, self.prefix_weight, self.prefix_tokens

        def solve(lo: int, hi: int, first: int, last: int) -> None:
            # current[j] for j in [lo, hi], knowing the best split of each lies in [first, last].
            while lo <= hi:
                mid = (lo + hi) // 2
                top = values[mid - 1]
                best, best_i = math.inf, first
                for i in range(first, min(mid - 1, last) + 1):
                    cost = previous[i] + top * (weight[mid] - weight[i]) - (tokens[mid] - tokens[i])
                    if cost < best:
                        best, best_i = cost, i
                current[mid], split[mid] = best, best_i
                solve(lo, mid - 1, first, best_i)
                lo, first = mid + 1, best_i  # right half iteratively: recursion depth stays log n

        solve(k, n, k - 1, n - 1)
        self.best.append(current)
        self.split.append(split)
        return current[n]

    def buckets(self, count: int) -> tuple[int, ...]:
        """The bucket lengths of the best plan with ``count`` buckets (a computed layer)."""
        out: list[int] = []
        j = len(self.values)
        for k in range(count, 0, -1):
            out.append(self.values[j - 1])
            j = self.split[k][j]
        return tuple(reversed(out))


def plan_fixed(values: Sequence[int], weights: Sequence[Weight], max_buckets: int) -> Plan:
    """The minimum-padding plan with at most ``max_buckets`` buckets.

    With at least as many buckets as distinct values, every value is its own
    bucket and nothing is padded: more buckets could not help, so none are added.
    """
    if max_buckets < 1:
        raise ValueError(f"max_buckets must be >= 1, got {max_buckets}")
    program = _SplitProgram(values, weights)
    count = min(max_buckets, program.max_buckets)
    for _ in range(count):
        program.extend()
    return Plan(program.buckets(count), program.padding(count))


def plan_by_compile_cost(
    values: Sequence[int],
    weights: Sequence[Weight],
    *,
    compile_cost: float,
    scale: float = 1.0,
    max_buckets: int | None = None,
) -> Plan:
    """The plan minimising ``scale * padding + compile_cost * buckets``.

    ``scale`` turns the weighted padding into the caller's token units (e.g.
    expected requests / total weight); ``compile_cost`` is what one more compiled
    bucket is worth in those tokens. Because the least padding is convex in the
    bucket count, the first bucket count whose successor saves no more than
    ``compile_cost`` is the global optimum (ties go to fewer buckets).
    """
    if compile_cost < 0:
        raise ValueError(f"compile_cost must be >= 0, got {compile_cost}")
    program = _SplitProgram(values, weights)
    limit = program.max_buckets if max_buckets is None else min(max_buckets, program.max_buckets)
    program.extend()
    count = 1
    while count < limit:
        saving = scale * (program.padding(count) - program.extend())
        if saving <= compile_cost:
            break
        count += 1
    return Plan(program.buckets(count), program.padding(count))
