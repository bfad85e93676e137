"""Bucket arithmetic: the decision is the smallest fitting bucket, checked against brute force."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmcache.errors import RegistryError, UsageError
from warmcache.modeling.generation import max_new_tokens_that_fit, prompt_fits
from warmcache.shapes import BucketTable, ShapeFamily
from warmcache.shapes.workload_settings import GenerateSettings, TrainSettings, from_stored

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


def test_settings_travel_through_the_registry_object_unchanged() -> None:
    generate = GenerateSettings(
        64, num_beams=2, num_return_sequences=2, do_sample=True, prefill_chunk_size=16, cache_implementation="hybrid"
    )
    assert from_stored("generate", generate.stored(), 64, "row g") == generate
    assert "max_cache_len" not in generate.stored()  # a column of its own
    train = TrainSettings(bf16=True)
    assert from_stored("train", train.stored(), None, "row t") == train
    assert from_stored("generate", {}, 32, "row d") == GenerateSettings(32)  # an absent key is the one default
    with pytest.raises(RegistryError, match=r"^row g: settings key 'beams' is not a generate setting$"):
        from_stored("generate", {"beams": 2}, 64, "row g")
    with pytest.raises(RegistryError, match=r"^row g: a generate row without max_cache_len$"):
        from_stored("generate", {}, None, "row g")


def test_a_family_hands_out_only_its_own_workloads_settings() -> None:
    train = ShapeFamily("m", "float32", TrainSettings())
    assert (train.workload, train.max_cache_len, train.train) == ("train", None, TrainSettings())
    with pytest.raises(UsageError, match=r"^m/train float32: not a generate family"):
        _ = train.generate
    generate = ShapeFamily("m", "float32", GenerateSettings(32))
    assert (generate.workload, generate.max_cache_len, generate.generate.max_cache_len) == ("generate", 32, 32)
    with pytest.raises(UsageError, match="not a train family"):
        _ = generate.train


def test_prompt_fits_leaves_room_for_one_decoded_token() -> None:
    assert prompt_fits(31, 32) and not prompt_fits(32, 32)
    assert max_new_tokens_that_fit(31, 32) == 2
