"""The decode-agreement criterion on constructed logits: each side of each bound (the real packages are in test_real_configs)."""

from __future__ import annotations

import pytest
import torch

from warmcache.warmup.verify.agreement import TOLERANCE, judge

VOCAB = 64


def _reference(steps: int = 3, seed: int = 0) -> torch.Tensor:
    """``[1, steps, VOCAB]`` logits whose best token at each step is ``step`` and the runner-up ``step + 1``, 0.02 RMS below."""
    logits = torch.randn(1, steps, VOCAB, generator=torch.Generator().manual_seed(seed))
    for step in range(steps):
        logits[0, step, step] = logits[0, step, step + 1] = 10.0
        rms = float(logits[0, step].pow(2).mean().sqrt())  # moves by under 0.1 % when the runner-up drops
        logits[0, step, step + 1] = 10.0 - 0.02 * rms
    return logits


def test_the_best_tokens_with_the_same_logits_agree() -> None:
    reference = _reference()
    verdict = judge(reference, torch.tensor([[0, 1, 2]]), "float32", reference.clone())
    assert verdict.agrees and verdict.logit_error == 0 and verdict.token_deficit == 0 and verdict.near_ties == 0


@pytest.mark.parametrize(("dtype", "agrees"), [("bfloat16", True), ("float32", False)])
def test_a_near_tie_may_go_either_way_within_the_dtypes_tolerance(dtype: str, agrees: bool) -> None:
    # The runner-up is 2 % of the RMS below the best: within bfloat16's 4 %, far outside float32's 0.1 %.
    verdict = judge(_reference(), torch.tensor([[0, 2, 2]]), dtype)
    assert verdict.agrees is agrees and verdict.near_ties == 1 and verdict.worst_step == 1
    assert verdict.token_deficit == pytest.approx(0.02, rel=0.01)


def test_a_token_far_from_the_best_never_agrees() -> None:
    verdict = judge(_reference(), torch.tensor([[0, 1, 40]]), "bfloat16")
    assert not verdict.agrees and verdict.worst_step == 2 and "differs from (worst at step 3)" in verdict.describe()


def test_logits_off_by_more_than_the_tolerance_fail_even_with_the_right_tokens() -> None:
    reference = _reference()
    served = reference.clone()
    served[0, 1] += torch.randn(VOCAB, generator=torch.Generator().manual_seed(9)) * reference[0, 1].pow(2).mean().sqrt() * 2 * TOLERANCE["bfloat16"]
    verdict = judge(reference, torch.tensor([[0, 1, 2]]), "bfloat16", served)
    assert not verdict.agrees and verdict.logit_error is not None and verdict.logit_error > TOLERANCE["bfloat16"] and verdict.worst_step == 1


def test_a_forbidden_best_token_is_skipped() -> None:
    reference = _reference()
    # End-of-sequence (here token 0) scores best at step 0, but min_new_tokens forbade it: the runner-up is the best allowed.
    verdict = judge(reference, torch.tensor([[1, 1, 2]]), "float32", forbidden=[0])
    assert verdict.agrees and verdict.token_deficit == 0
