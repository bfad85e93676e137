"""The bucket ladders people use without a planner, to compare the plan against.

* Powers of two, as NxDI / transformers-neuronx generate them: ``2**i`` from
  ``int(log2(floor))`` up to (not including) ``round(log2(max_length))``, then
  ``max_length`` itself, so the longest request always fits and no bucket sits
  just below it (NxDI's floor is 128 for context encoding).
* Evenly spaced: ``ceil(max_length * i / K)`` for ``i = 1..K``.

Each family is a function ``K -> buckets`` so that a comparison can ask both
"how much padding at the plan's K?" and "how many buckets would this family need
to pad no more than the plan?".
"""

from __future__ import annotations

import math

#: NxDI's default smallest context-encoding bucket.
DEFAULT_POW2_FLOOR = 128


def powers_of_two(max_length: int, floor: int = DEFAULT_POW2_FLOOR) -> tuple[int, ...]:
    """The NxDI ladder from ``floor`` to ``max_length`` (just ``(max_length,)`` when floor >= max_length)."""
    if max_length < 1 or floor < 1:
        raise ValueError(f"max_length and floor must be >= 1, got {max_length} and {floor}")
    if floor >= max_length:
        return (max_length,)
    top = round(math.log2(max_length))
    return tuple(2**i for i in range(int(math.log2(floor)), top)) + (max_length,)


def powers_of_two_count(max_length: int, buckets: int) -> tuple[int, ...]:
    """The NxDI ladder with ``buckets`` buckets: the floor moves so the ladder has that many.

    A ladder cannot go below 1, so a short ``max_length`` may yield fewer buckets.
    """
    top = round(math.log2(max_length))
    return powers_of_two(max_length, floor=2 ** max(top - buckets + 1, 0))


def powers_of_two_most(max_length: int) -> int:
    """How many buckets the longest powers-of-two ladder (from 1) has."""
    return len(powers_of_two(max_length, floor=1))


def evenly_spaced(max_length: int, buckets: int) -> tuple[int, ...]:
    """``buckets`` evenly spaced lengths ending at ``max_length`` (fewer if max_length < buckets)."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    return tuple(sorted({math.ceil(max_length * i / buckets) for i in range(1, buckets + 1)}))
