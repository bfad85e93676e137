"""How often a right decode takes the other expert at a mixture of experts' router near-ties, and when more is too many.

A served decode may agree with the reference computed with the other expert at a router
near-tie (:mod:`.routing`); one that does so at more ties than a right decode would, at a
chance under :data:`REROUTE_SIGNIFICANCE`, routes unlike the model (:mod:`.agreement`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from warmcache.warmup.verify.routing import Alternative

#: A served decode that took the other expert at more router near-ties than a right decode would, at this chance or
#: less, is held to differ: it routes unlike the model (a router computed in lower precision, a biased gate), though
#: each rerouted step alone is within the bound of its routing.
REROUTE_SIGNIFICANCE = 1e-3


def reroute_chances(
    alternatives: Sequence[Alternative], eager_error: torch.Tensor, floor: float, factor: float
) -> list[float]:
    """For each router near-tie, the chance that a right decode takes the other expert there.

    A right decode is at most ``factor`` (:data:`.agreement.FACTOR`) times as far from the
    reference as the eager decode (``eager_error`` ``[rows, steps]``, never below ``floor``), and
    a router's logits carry the relative rounding its hidden states carry (:mod:`.routing`): the
    gap between the two tied experts' logits moves by about ``factor * e * sqrt(2)`` (two logits,
    each off by ``e`` relative), so a tie of relative ``margin`` flips with chance
    ``Phi(-margin / (factor * e * sqrt(2)))``. Taking the output logits' distance for the router's
    is generous (rounding grows with depth, and routers sit inside the model): a right decode
    flips fewer, never more, than this says.
    """
    chances = []
    for alternative in alternatives:
        noise = max(float(eager_error[alternative.tie.row, alternative.tie.step]), floor)
        chances.append(0.5 * math.erfc(alternative.tie.margin / (2 * factor * noise)))
    return chances


def chance_of_at_least(count: int, chances: Sequence[float]) -> float:
    """The chance that ``count`` or more of independent events with the given ``chances`` happen."""
    distribution = [1.0]  # distribution[k]: the chance that exactly k of the events so far happened
    for chance in chances:
        distribution = [
            (distribution[k] if k < len(distribution) else 0.0) * (1 - chance)
            + (distribution[k - 1] * chance if k > 0 else 0.0)
            for k in range(len(distribution) + 1)
        ]
    return sum(distribution[count:])
