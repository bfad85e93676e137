"""Router near-ties of a mixture of experts: the other routing a served decode may rightly take at a step.

A mixture-of-experts router keeps the ``top_k`` experts of highest score. Where the
``top_k``-th and the next score of the higher-precision reference differ by less than the
rounding the model carries in its own dtype, a right served decode may route the token to
either expert, and that step's logits move far (one expert's output in or out). So at such a
near-tie verify also computes the reference with the two experts swapped (the alternative
routing, forced: the router's own scores, the other selection) and lets the judge accept a
step that is within its bound of either routing (:func:`.agreement.judge`).

A near-tie is measured on the router's logits (every family here ranks by them or by their
softmax, which keeps their order): their gap, over the RMS of that token's router logits, is
at most the relative distance the served logits may have from the reference, because router
logits and output logits are both read from hidden states that carry the same relative
rounding.

Routers forced, by class (their ``forward`` returns ``(router_logits, weights, indices)``):
Qwen3-MoE's, DeepSeek-V2's with ``topk_method="greedy"`` and gpt-oss's, whose weights for a
chosen selection are recomputed as their own ``forward`` does (:data:`_WEIGHTS`). Any other
router (DeepSeek-V2's ``group_limited_greedy``, whose group choice may tie as well) is not
forced: its near-ties are judged as any other step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: At most this many alternative routings are computed (one higher-precision forward each), nearest ties first.
MAX_ALTERNATIVES = 16


def _softmax_then_gather(module: Any, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    import torch

    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).gather(-1, indices)
    if getattr(module, "norm_topk_prob", False):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights * getattr(module, "routed_scaling_factor", 1.0)).to(logits.dtype)


def _gather_then_softmax(module: Any, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    import torch

    chosen = logits.gather(-1, indices)
    return torch.softmax(chosen, dim=1, dtype=chosen.dtype)


#: The routing weights each router class computes for a chosen selection of experts, as its own ``forward`` does.
_WEIGHTS: dict[str, Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "Qwen3MoeTopKRouter": _softmax_then_gather,
    "DeepseekV2TopkRouter": _softmax_then_gather,
    "GptOssTopKRouter": _gather_then_softmax,
}


def forceable_routers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The model's routers this module can force, by module name (empty for a dense model)."""
    return {
        name: module
        for name, module in model.named_modules()
        if type(module).__name__ in _WEIGHTS and getattr(module, "topk_method", "greedy") == "greedy"
    }


@dataclass(frozen=True, slots=True)
class NearTie:
    """A decode step where the reference's ``top_k``-th expert and the next scored within ``margin`` of each other."""

    router: str
    row: int
    step: int
    chosen: int
    """The reference's ``top_k``-th expert."""
    other: int
    """The expert just below it, which a served decode may pick instead."""
    margin: float
    """Their router-logit gap over the RMS of the token's router logits."""


@dataclass(frozen=True, slots=True)
class Alternative:
    """The reference's logits for one row when the router at a near-tie takes the other expert."""

    tie: NearTie
    logits: torch.Tensor
    """``[steps, vocab]`` in float64: every step of the row (the swap also reaches later steps through attention)."""


@contextmanager
def recording(routers: dict[str, torch.nn.Module]) -> Iterator[dict[str, torch.Tensor]]:
    """Collect each router's logits ``[tokens, experts]`` of one forward, by router name."""
    recorded: dict[str, torch.Tensor] = {}

    def hook(name: str) -> Callable[..., None]:
        def record(module: Any, args: Any, output: Any) -> None:
            recorded[name] = output[0].detach().reshape(-1, output[0].shape[-1])

        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in routers.items()]
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def forcing(router: torch.nn.Module, token: int, chosen: int, other: int) -> Iterator[None]:
    """Make ``router`` route flat token ``token`` to ``other`` instead of ``chosen``, with the weights its own scores
    give that selection."""
    weights_for = _WEIGHTS[type(router).__name__]

    def force(module: Any, args: Any, output: Any) -> Any:
        logits, weights, indices = output
        flat = logits.reshape(-1, logits.shape[-1])
        indices = indices.clone()
        row = indices[token]
        row[row == chosen] = other
        weights = weights.clone()
        weights[token] = weights_for(module, flat[token : token + 1], row[None])[0].to(weights.dtype)
        return logits, weights, indices

    handle = router.register_forward_hook(force)
    try:
        yield
    finally:
        handle.remove()


def near_ties(
    router_logits: dict[str, torch.Tensor],
    routers: dict[str, torch.nn.Module],
    rows: int,
    prompt_length: int,
    steps: int,
    tolerance: float,
) -> list[NearTie]:
    """The decode steps whose routing is a near-tie within ``tolerance`` (relative to the token's router-logit RMS),
    nearest first; ``router_logits`` from one forward over ``rows`` rows of ``prompt_length + steps - 1`` tokens."""
    import torch

    ties = []
    length = prompt_length + steps - 1
    for name, logits in router_logits.items():
        k = int(getattr(routers[name], "top_k", 0))
        if logits.shape[-1] <= k:
            continue
        scores = logits.double().reshape(rows, length, -1)[:, prompt_length - 1 :]
        values, experts = torch.topk(scores, k + 1, dim=-1)
        margin = (values[..., k - 1] - values[..., k]) / scores.pow(2).mean(-1).sqrt().clamp(min=1e-30)
        for row, step in (margin <= tolerance).nonzero().tolist():
            chosen, other = int(experts[row, step, k - 1]), int(experts[row, step, k])
            ties.append(NearTie(name, row, step, chosen, other, float(margin[row, step])))
    return sorted(ties, key=lambda tie: tie.margin)


def alternative_routings(
    precise: torch.nn.Module,
    forward: Callable[[], torch.Tensor],
    rows: int,
    prompt_length: int,
    steps: int,
    tolerance: float,
) -> list[Alternative]:
    """For each router near-tie of the higher-precision model ``precise`` (nearest :data:`MAX_ALTERNATIVES`), the
    reference with the tied experts swapped.

    ``forward``: the reference's one forward pass (returns ``[rows, steps, vocab]``); it runs
    once to find the ties and once per tie with the swap forced.
    """
    routers = forceable_routers(precise)
    if not routers:
        return []
    with recording(routers) as recorded:
        forward()
    ties = near_ties(recorded, routers, rows, prompt_length, steps, tolerance)[:MAX_ALTERNATIVES]
    length = prompt_length + steps - 1
    alternatives = []
    for tie in ties:
        token = tie.row * length + prompt_length - 1 + tie.step
        with forcing(routers[tie.router], token, tie.chosen, tie.other):
            alternatives.append(Alternative(tie, forward()[tie.row].double()))
    return alternatives
