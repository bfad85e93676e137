"""Call-at-a-time latency, as the guard and serving benchmarks time a decision (``time.perf_counter_ns``)."""

from __future__ import annotations

import time
from collections.abc import Callable


def percentiles(samples_ns: list[int]) -> tuple[float, float]:
    """The median and the 99th percentile of ``samples_ns``, in microseconds."""
    ordered = sorted(samples_ns)
    return ordered[len(ordered) // 2] / 1000, ordered[int(len(ordered) * 0.99)] / 1000


def time_each(call: Callable[[int, int], object], requests: list[tuple[int, int]]) -> list[int]:
    """Nanoseconds of each ``call(batch, length)`` over ``requests``, one at a time."""
    clock = time.perf_counter_ns
    samples = []
    for batch, length in requests:
        start = clock()
        call(batch, length)
        samples.append(clock() - start)
    return samples
