"""The decode-agreement criterion on constructed logits: each side of each bound (real packages:
tests/test_real_configs.py)."""

from __future__ import annotations

import pytest
import torch

from warmcache.warmup.verify.agreement import FACTOR, MEAN_FACTOR, judge
from warmcache.warmup.verify.routing import Alternative, NearTie

VOCAB = 64
STEPS = 3


def _reference(seed: int = 0) -> torch.Tensor:
    """``[1, STEPS, VOCAB]`` logits whose best token at each step is ``step`` and the runner-up ``step + 1``, 0.02
    RMS below."""
    logits = torch.randn(1, STEPS, VOCAB, generator=torch.Generator().manual_seed(seed))
    for step in range(STEPS):
        logits[0, step, step] = logits[0, step, step + 1] = 10.0
        rms = float(logits[0, step].pow(2).mean().sqrt())  # moves by under 0.1 % when the runner-up drops
        logits[0, step, step + 1] = 10.0 - 0.02 * rms
    return logits


def _off_by(reference: torch.Tensor, relative: float, seed: int) -> torch.Tensor:
    """``reference`` plus noise whose RMS is ``relative`` times each step's logit RMS."""
    noise = torch.randn(reference.shape, generator=torch.Generator().manual_seed(seed))
    noise = noise / noise.pow(2).mean(-1, keepdim=True).sqrt()
    return reference + noise * reference.pow(2).mean(-1, keepdim=True).sqrt() * relative


BEST = torch.tensor([[0, 1, 2]])


@pytest.mark.parametrize(
    ("times_eager", "agrees"),
    [
        ((0.5, 0.5, 0.5), True),
        ((1.0, 1.0, FACTOR * 0.9), True),  # one step near the per-step bound, the mean well within its own
        ((1.0, 1.0, FACTOR * 1.2), False),  # one step beyond it, though the mean is within its bound
        ((MEAN_FACTOR * 0.9,) * 3, True),
        ((MEAN_FACTOR * 1.2,) * 3, False),  # every step within the per-step bound, the mean beyond its own
    ],
)
def test_served_logits_may_be_factor_times_the_eager_distance_at_a_step_and_mean_factor_times_it_on_average(
    times_eager: tuple[float, ...], agrees: bool
) -> None:
    """A wrong layer moves every step a little (at one real-width layer in bfloat16, 5 % reached twice the eager
    distance), a right decode's rounding moves one step a lot: the mean bound catches the first, the per-step one
    leaves room for the second."""
    reference = _reference()
    eager = _off_by(reference, 0.01, seed=1)  # the model's own step-by-step decode: 1 % from its one-pass logits
    served = _off_by(reference, 0.01 * torch.tensor(times_eager)[None, :, None], seed=2)
    verdict = judge(reference, eager, BEST, "bfloat16", served)
    assert verdict.eager_logit_error == pytest.approx(0.01, rel=1e-3)
    assert verdict.eager_mean_logit_error == pytest.approx(0.01, rel=1e-3)
    assert verdict.agrees is agrees, verdict.describe()


@pytest.mark.parametrize(
    ("dtype", "depth", "width", "distance", "agrees"),
    [
        # one float32 epsilon per layer's output and 16 per sqrt(depth x width) of accumulation: 17 at 1 x 1
        ("float32", 1, 1, 1.9e-6, True),
        ("float32", 1, 1, 2.2e-6, False),
        ("float32", 16, 64, 6.0e-5, True),  # 4 + 16 x 32 = 516 epsilons (6.2e-5) at 16 layers 64 wide
        ("float32", 16, 64, 6.5e-5, False),
        ("float32", 1, 1, 1e-3, False),  # a float32 model computed in bfloat16 somewhere, or TF32 matmuls
        ("bfloat16", 1, 1, 0.007, True),
        ("bfloat16", 1, 1, 0.03, False),
    ],
)
def test_when_the_eager_decode_is_the_reference_bitwise_the_floor_of_depth_and_width_still_passes(
    dtype: str, depth: int, width: int, distance: float, agrees: bool
) -> None:
    reference = _reference()
    served = _off_by(reference, distance, seed=3)
    verdict = judge(reference, reference.clone(), BEST, dtype, served, depth=depth, width=width)
    assert verdict.eager_logit_error == 0 and verdict.floor > 0 and verdict.agrees is agrees, verdict.describe()


def test_figures_too_small_for_a_percentage_print_in_scientific_notation() -> None:
    """A float32 decode is 1e-6 from its reference: "0.00 % (allowed 0.00 %)" told the reader nothing (issue 36)."""
    reference = _reference()
    verdict = judge(reference, _off_by(reference, 1e-6, seed=5), BEST, "float32", _off_by(reference, 4e-6, seed=6))
    line = verdict.describe()
    assert not verdict.agrees and "logits 4.0e-06 from the reference (allowed 2.0e-06)" in line, line
    assert "0.00%" not in line, line


def test_a_near_tie_may_go_either_way_and_a_token_far_from_the_best_may_not() -> None:
    reference = _reference()
    eager = _off_by(reference, 0.005, seed=4)  # its largest single-logit distance reaches past the 2 % runner-up gap
    near_tie = judge(reference, eager, torch.tensor([[0, 2, 2]]), "bfloat16")
    assert near_tie.agrees and near_tie.near_ties == 1 and near_tie.worst_step == 1, near_tie.describe()
    assert near_tie.token_deficit == pytest.approx(0.02, rel=0.01)
    far = judge(reference, eager, torch.tensor([[0, 1, 40]]), "bfloat16")
    assert not far.agrees and far.worst_step == 2 and "differs from (worst at step 3)" in far.describe()


def test_a_forbidden_best_token_is_skipped() -> None:
    reference = _reference()
    # End-of-sequence (token 0 here) scores best at step 0, but min_new_tokens forbade it: the runner-up is the best
    # allowed.
    verdict = judge(reference, reference.clone(), torch.tensor([[1, 1, 2]]), "float32", forbidden=[0])
    assert verdict.agrees and verdict.token_deficit == 0


def _rerouted_at(reference: torch.Tensor, step: int) -> Alternative:
    """The reference with step ``step`` (and after) moved 20 % as one expert more or less moves it."""
    logits = reference[0].clone()
    logits[step:] = _off_by(reference, 0.2, seed=7)[0, step:]
    return Alternative(NearTie("model.layers.0.mlp.gate", 0, step, chosen=3, other=5, margin=1e-3), logits)


def test_a_step_that_took_the_other_expert_at_a_router_near_tie_agrees_with_that_routing_and_is_counted() -> None:
    reference = _reference()
    eager = _off_by(reference, 0.01, seed=1)
    alternative = _rerouted_at(reference, 1)
    served = _off_by(reference, 0.01, seed=2)
    served[0, 1:] = _off_by(alternative.logits[None], 0.01, seed=8)[0, 1:]
    assert not judge(reference, eager, BEST, "bfloat16", served).agrees  # 20 % from the reference's routing
    verdict = judge(reference, eager, BEST, "bfloat16", served, alternatives=[alternative])
    assert verdict.agrees and verdict.rerouted_steps == 2, verdict.describe()
    assert "2 steps matched an alternative routing at a router near-tie" in verdict.describe()


def test_an_alternative_routing_excuses_neither_a_step_before_its_tie_nor_a_wrong_decode() -> None:
    reference = _reference()
    eager = _off_by(reference, 0.01, seed=1)
    moved = _rerouted_at(reference, 1)  # its logits move from step 1, but its tie is at step 2
    alternative = Alternative(NearTie("model.layers.0.mlp.gate", 0, 2, 3, 5, 1e-3), moved.logits)
    rerouted_early = _off_by(reference, 0.01, seed=2)
    rerouted_early[0, 1:] = _off_by(alternative.logits[None], 0.01, seed=8)[0, 1:]
    early = judge(reference, eager, BEST, "bfloat16", rerouted_early, alternatives=[alternative])
    assert not early.agrees and early.worst_step == 1 and early.rerouted_steps == 1, early.describe()
    wrong = judge(reference, eager, BEST, "bfloat16", _off_by(reference, 0.05, seed=9), alternatives=[alternative])
    assert not wrong.agrees and wrong.rerouted_steps == 0, wrong.describe()


def test_the_eager_decode_is_measured_at_the_routing_it_took_so_its_own_reroute_does_not_widen_the_bound() -> None:
    reference = _reference()
    alternative = _rerouted_at(reference, 2)
    eager = _off_by(reference, 0.01, seed=1)
    eager[0, 2:] = _off_by(alternative.logits[None], 0.01, seed=10)[0, 2:]  # the eager decode took the other expert
    one_mlp_off = _off_by(reference, 0.05, seed=11)  # 5 % everywhere: a wrong decode
    assert judge(reference, eager, BEST, "bfloat16", one_mlp_off).agrees  # the eager reroute let it pass
    verdict = judge(reference, eager, BEST, "bfloat16", one_mlp_off, alternatives=[alternative])
    assert not verdict.agrees and verdict.eager_logit_error == pytest.approx(0.01, rel=0.05), verdict.describe()
    assert verdict.eager_rerouted_steps == 1


def test_a_decode_that_takes_the_other_expert_at_more_near_ties_than_a_right_one_would_differs() -> None:
    # Six steps, each with a router near-tie at the edge of the bound (eager 1 % off: 2 % allowed), whose other routing
    # moves that step's logits by 20 %. A right decode, up to twice as far off as the eager one, flips each with
    # chance Phi(-0.02 / (2 * 0.01 * sqrt(2))) = 0.24: two flips are ordinary, all six have chance 0.24**6 = 2e-4.
    steps = 6
    reference = torch.randn(1, steps, VOCAB, generator=torch.Generator().manual_seed(3))
    tokens = reference.argmax(-1)
    eager = _off_by(reference, 0.01, seed=1)
    moved = _off_by(reference, 0.2, seed=7)
    alternatives = []
    for step in range(steps):
        logits = reference[0].clone()
        logits[step] = moved[0, step]
        alternatives.append(Alternative(NearTie("model.layers.0.mlp.gate", 0, step, 3, 5, margin=0.02), logits))

    def rerouted_at(flipped: range) -> torch.Tensor:
        served = _off_by(reference, 0.01, seed=2)
        for step in flipped:
            served[0, step] = _off_by(moved, 0.01, seed=8)[0, step]
        return served

    two = judge(reference, eager, tokens, "bfloat16", rerouted_at(range(2)), alternatives=alternatives)
    assert two.agrees and (two.rerouted_ties, two.router_ties) == (2, 6), two.describe()
    assert two.expected_reroutes == pytest.approx(6 * 0.24, rel=0.1)
    every = judge(reference, eager, tokens, "bfloat16", rerouted_at(range(steps)), alternatives=alternatives)
    assert every.rerouted_ties == 6 and every.reroute_chance < 1e-3 and not every.agrees, every.describe()
    assert "the other expert at 6 of 6 near-ties" in every.describe()
