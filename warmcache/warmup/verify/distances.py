"""How far a decode is from the reference, per candidate routing, row and step, relative to the logit RMS.

What :func:`.agreement.judge` measures before it bounds anything: the served decode's and the
eager decode's distance to the reference (and to each alternative routing at a router
near-tie, :mod:`.routing`), and how far each one's chosen token falls below the best.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

    from warmcache.warmup.verify.routing import Alternative


def logit_scale(logits: torch.Tensor) -> torch.Tensor:
    """Each step's logit RMS (over the vocabulary), the scale every distance here is relative to; never 0."""
    import torch

    return logits.double().pow(2).mean(-1).sqrt().clamp(min=torch.finfo(torch.float32).tiny)


class PerRouting(NamedTuple):
    """Per candidate routing (the reference, then each alternative), per row and step: ``[routings, rows, steps]``,
    relative to the reference's logit RMS."""

    eager: torch.Tensor
    """The eager decode's distance."""
    eager_max: torch.Tensor
    """The eager decode's largest single-logit distance."""
    eager_pick: torch.Tensor
    """How far the eager decode's own greedy pick falls below the best."""
    error: torch.Tensor
    """The served decode's distance (0 where only its tokens are known)."""
    deficit: torch.Tensor
    """How far the served token falls below the best."""


def per_routing(
    reference: torch.Tensor,
    scale: torch.Tensor,
    eager: torch.Tensor,
    tokens: torch.Tensor,
    served_logits: torch.Tensor | None,
    forbidden: Sequence[int],
    alternatives: Sequence[Alternative],
) -> PerRouting:
    """How far the eager and the served decode are from the reference and from each alternative routing (a row's
    reference from its near-tie's step on, with the tied experts swapped), relative to ``scale``
    (:func:`logit_scale` of the reference); ``forbidden``: token ids no decode could pick."""
    import torch

    banned = [i for i in forbidden if i < reference.shape[-1]]

    def distance(logits: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
        return (logits.double().to(reference.device) - truth).pow(2).mean(-1).sqrt() / scale

    def deficit(chosen: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
        allowed = truth.clone()
        allowed[..., banned] = float("-inf")
        return (allowed.amax(-1) - truth.gather(-1, chosen[..., None].to(truth.device))[..., 0]) / scale

    eager_pick = eager.clone()
    eager_pick[..., banned] = float("-inf")
    eager_pick = eager_pick.argmax(-1)
    columns: list[tuple[torch.Tensor, ...]] = []
    for alternative in (None, *alternatives):
        truth = reference
        if alternative is not None:
            truth = reference.clone()
            truth[alternative.tie.row, alternative.tie.step :] = alternative.logits[alternative.tie.step :]
        served = distance(served_logits, truth) if served_logits is not None else torch.zeros_like(scale)
        eager_max = (eager - truth).abs().amax(-1) / scale
        columns.append((distance(eager, truth), eager_max, deficit(eager_pick, truth), served, deficit(tokens, truth)))
    return PerRouting(*(torch.stack(column) for column in zip(*columns, strict=True)))
