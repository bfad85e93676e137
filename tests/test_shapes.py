"""Bucket arithmetic: the decision is the smallest fitting bucket, checked against brute force."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmcache.shapes import BucketTable

GRID = {(b, n) for b in (1, 2, 4) for n in (16, 32, 64)}


def test_exact_pad_and_refuse() -> None:
    table = BucketTable.from_pairs(GRID)
    assert table.decide(2, 32).kind == "exact"
    pad = table.decide(3, 17)
    assert (pad.kind, pad.target) == ("pad", (4, 32))
    refuse = table.decide(5, 16)
    assert refuse.kind == "refuse" and not refuse.runnable
    assert refuse.nearest[0] == (4, 16)
    assert table.decide(1, 65).kind == "refuse"


def test_skips_batches_without_a_long_enough_length() -> None:
    table = BucketTable.from_pairs({(1, 16), (2, 128), (4, 64)})
    assert table.decide(1, 100).target == (2, 128)
    assert table.decide(1, 16).target == (1, 16)


def test_memoised_decisions_are_identical() -> None:
    table = BucketTable.from_pairs(GRID)
    assert table.decide(3, 20) is table.decide(3, 20)


pairs = st.sets(st.tuples(st.integers(1, 12), st.integers(1, 40)), min_size=1, max_size=25)


@given(pairs, st.integers(1, 14), st.integers(1, 44))
def test_decision_matches_brute_force(compiled: set[tuple[int, int]], batch: int, length: int) -> None:
    decision = BucketTable.from_pairs(compiled).decide(batch, length)
    fitting = sorted(p for p in compiled if p[0] >= batch and p[1] >= length)
    if not fitting:
        assert decision.kind == "refuse" and decision.nearest
    else:
        assert decision.target == fitting[0]
        assert decision.kind == ("exact" if fitting[0] == (batch, length) else "pad")
