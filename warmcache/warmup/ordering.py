"""Longest shapes first: the order a fleet claims specs in, so its tail is short.

Claimed in manifest order, a fleet finishes its short shapes early and leaves
one host compiling the longest shape alone at the end; starting the longest
first (LPT scheduling) keeps every host busy until the last few short ones.
A spec's expected compile time is, in order of preference:

1. its shape's own last recorded compile time (an older toolchain's or config's
   row of the same shape: compile times change less between versions than
   between shapes);
2. the median recorded for its model and workload;
3. unknown: such specs go first, largest ``batch × length`` first, because an
   unknown spec may be the longest of all and starting it late is what makes a
   long tail (and a fresh manifest, with no history at all, is then ordered by size).

Ties keep a family (one model, workload and batch size) together, its longest
first: a family's prompt lengths share one decode graph, so a worker that takes
them one after another traces it once, not once per length.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from warmcache.identity.plan import PlannedShape
from warmcache.registry import Registry
from warmcache.registry.queries import CompileTime


def longest_first(todo: Sequence[PlannedShape], expected: Mapping[str, float]) -> list[PlannedShape]:
    """``todo`` ordered by expected compile time (:func:`expected_seconds`), longest first (see the module
    docstring)."""
    largest: dict[tuple[str, str, int], int] = {}
    for p in todo:
        family = (p.model.name, p.spec.workload, p.spec.batch_size)
        largest[family] = max(largest.get(family, 0), _size(p))

    def key(p: PlannedShape) -> tuple[bool, float, int, str, str, int, int, str]:
        seconds = expected.get(p.identity)
        family = (p.model.name, p.spec.workload, p.spec.batch_size)
        return (seconds is not None, -(seconds or 0.0), -largest[family], *family, -_size(p), p.identity)

    return sorted(todo, key=key)


def _size(p: PlannedShape) -> int:
    """What an unknown spec's compile time is guessed from: ``batch × length``."""
    return p.spec.batch_size * p.spec.seq_len


def expected_seconds(registry: Registry, todo: Sequence[PlannedShape]) -> dict[str, float]:
    """``{identity: expected compile seconds}`` for the specs the registry has any history for."""
    latest: dict[str, CompileTime] = {}
    by_group: dict[tuple[str, str], list[float]] = {}
    for recorded in registry.compile_times(sorted({p.model.name for p in todo})):
        if recorded.shape_hash not in latest or recorded.updated_at > latest[recorded.shape_hash].updated_at:
            latest[recorded.shape_hash] = recorded
        by_group.setdefault((recorded.model, recorded.workload), []).append(recorded.seconds)
    medians = {group: statistics.median(values) for group, values in by_group.items()}
    out: dict[str, float] = {}
    for p in todo:
        if p.shape_hash in latest:
            out[p.identity] = latest[p.shape_hash].seconds
        elif (p.model.name, p.spec.workload) in medians:
            out[p.identity] = medians[(p.model.name, p.spec.workload)]
    return out
