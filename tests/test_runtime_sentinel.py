"""The recompile sentinel: a compile inside a guarded region fails (strict policies) or is recorded (warn)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from warmcache.errors import UnseenShapeError
from warmcache.modeling.compile_counter import CompileCounter
from warmcache.runtime.sentinel import recompile_sentinel

pytestmark = pytest.mark.slow


def _compiled_double() -> Callable[[torch.Tensor], torch.Tensor]:
    return torch.compile(lambda x: x * 2, backend="eager", dynamic=False)


@pytest.mark.parametrize("policy", ["pad", "refuse"])
def test_strict_sentinel_turns_a_recompile_into_unseen_shape_error(policy: str) -> None:
    double = _compiled_double()
    double(torch.ones(2))  # loaded before the region, as prime() does
    with recompile_sentinel(policy, "bucket batch=2") as report:
        double(torch.ones(2))  # a cache hit is fine
    assert report.graphs == 0
    with pytest.raises(
        UnseenShapeError,
        match=r"bucket batch=2: torch.compile would recompile here \(policy " + policy + r"\).*size mismatch",
    ):
        with recompile_sentinel(policy, "bucket batch=2"):
            double(torch.ones(3))


def test_warn_sentinel_lets_the_compile_happen_and_records_it(caplog: pytest.LogCaptureFixture) -> None:
    double = _compiled_double()
    double(torch.ones(2))
    with recompile_sentinel("warn", "step 7") as report:
        assert double(torch.ones(5)).tolist() == [2.0] * 5
    assert report.graphs == 1
    assert "step 7 compiled 1 graph(s)" in caplog.text


def test_other_runtime_errors_pass_through_unchanged() -> None:
    with pytest.raises(RuntimeError, match="not a recompile"):
        with recompile_sentinel("refuse"):
            raise RuntimeError("not a recompile")


def test_running_out_of_the_recompile_budget_is_loud_and_room_can_be_reserved() -> None:
    from torch._dynamo.exc import FailOnRecompileLimitHit

    from warmcache.runtime.budget import loud_recompile_limit, reserve_recompile_room

    with torch._dynamo.config.patch(recompile_limit=1):
        # Dynamo's budget is per code object: each function here needs its own code.
        quiet = torch.compile(lambda x: x + 1, backend="eager", dynamic=False)
        quiet(torch.ones(2))
        with CompileCounter() as counter:
            assert quiet(torch.ones(3)).tolist() == [2.0] * 3  # past the limit: silently eager, still correct
        assert counter.graphs == 0
        loud = torch.compile(lambda x: x + 2, backend="eager", dynamic=False)
        loud(torch.ones(2))
        with pytest.raises(FailOnRecompileLimitHit), loud_recompile_limit():
            loud(torch.ones(3))
        reserve_recompile_room(3)
        assert torch._dynamo.config.recompile_limit >= 3
        fits = torch.compile(lambda x: x + 3, backend="eager", dynamic=False)
        with loud_recompile_limit(), CompileCounter() as counter:
            for n in (2, 3, 4):
                fits(torch.ones(n))
        assert counter.graphs == 3
