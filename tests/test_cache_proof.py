"""verify proves, on every route, that the decode through warmcache's static cache is the model's own.

The family that showed the gap is real: transformers 5.24's ``inkling_text`` with two
``hybrid`` layers (recurrent state beside attention, kinds warmcache's cache holds) decodes
other tokens through any static cache than through the cache ``generate()`` builds for it,
so it passed plan, warmup and verify and served 5 of 5 guarded requests other tokens than
eager (``warmcache_testkit.family_sweep``). The right families of the matrix pass the same proof in
``tests/test_architectures.py`` and every verify of a generate spec.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from warmcache_testkit.family_sweep import FAMILY_OVERRIDES, build_family_model
from warmcache_testkit.support_matrix import prepare


@pytest.mark.slow
def test_verify_disproves_a_family_whose_cache_warmcache_does_not_mirror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FAMILY_OVERRIDES, "inkling_text", {"layer_types": ["hybrid", "hybrid"]})
    model = build_family_model("inkling_text", tmp_path / "models" / "inkling")
    prepared = prepare(tmp_path, [], built={"inkling": model})
    assert prepared.verified["inkling"] == ["disproven", "disproven"]  # both prompt buckets
    failures = [line for line in prepared.generate["inkling"] if line.startswith("verify:")]
    assert len(failures) == 2
    assert all("the decode through warmcache's static cache is not the model's" in line for line in failures)
    assert all("transformers' own cache, in float64" in line for line in failures)
