"""Router near-ties of a mixture of experts: the other routing a served decode may rightly take at a step.

A mixture-of-experts router keeps the ``top_k`` experts of highest score. Where the
``top_k``-th and the next score of the higher-precision reference differ by less than the
rounding the model carries in its own dtype, a right served decode may route the token to
either expert, and that step's logits move far (one expert's output in or out). So at such a
near-tie verify also computes the reference with the two experts swapped (the alternative
routing, forced: the router's own scores, the other selection) and lets the judge accept a
step that is within its bound of either routing (:func:`.agreement.judge`).

A near-tie is measured on the router's logits: their gap, over the RMS of that token's router
logits, is at most the relative distance the served logits may have from the reference,
because router logits and output logits are both read from hidden states that carry the same
relative rounding.

Which routers can be forced is read off their own output, not a list of classes, so a family
this project never saw is handled as the ones it did: transformers' routers return
``(router_logits, weights, indices)``, and a router is forced when, over every token of the
reference's forward, its chosen experts are its logits' top ``k`` and its weights are a softmax
or a sigmoid of its logits at those experts, renormalised over them or not, times a constant
(:class:`WeightRule`: Qwen2/3-MoE, OLMoE, Mixtral, gpt-oss, Granite-MoE, DeepSeek-V2's greedy
router with its ``routed_scaling_factor``...). A router that chooses by something else
(DeepSeek-V2's ``group_limited_greedy`` and DeepSeek-V3's bias-corrected groups, whose group
choice may tie as well; Phi-MoE's sparsemixer) is not forced: its near-ties are judged as any
other step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast

if TYPE_CHECKING:
    import torch

#: At most this many alternative routings are computed (one higher-precision forward each), nearest ties first.
MAX_ALTERNATIVES = 16
#: How closely a rule must reproduce a router's own weights (relative) to be taken as the rule it follows.
_RULE_TOLERANCE = 1e-4


class RouterOutput(NamedTuple):
    """What a router returned for every token of one forward (``[tokens, experts]``, then ``[tokens, k]`` twice)."""

    logits: torch.Tensor
    weights: torch.Tensor
    indices: torch.Tensor


@dataclass(frozen=True, slots=True)
class WeightRule:
    """How a router weighs the experts it chose, read off its own output (:func:`read_rule`)."""

    activation: str
    """``softmax`` over every expert's logit, or ``sigmoid`` of each."""
    renormalised: bool
    """Whether the chosen experts' scores are divided by their sum."""
    scale: float
    """A constant the weights are multiplied by (DeepSeek's ``routed_scaling_factor``; 1 elsewhere)."""

    def weights(self, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The weights of the experts ``indices`` ``[..., k]`` for router ``logits`` ``[..., experts]``, in float64."""
        import torch

        scores = torch.softmax(logits.double(), dim=-1) if self.activation == "softmax" else logits.double().sigmoid()
        chosen = scores.gather(-1, indices)
        if self.renormalised:
            chosen = chosen / chosen.sum(dim=-1, keepdim=True)
        return chosen * self.scale


def read_rule(output: RouterOutput) -> WeightRule | None:
    """The :class:`WeightRule` that reproduces a router's weights for its own choices, when it chose its logits' top
    ``k``; ``None`` when no rule does (it is then not forced)."""
    import torch

    logits, weights, indices = output
    top = torch.topk(logits.double(), indices.shape[-1], dim=-1).indices
    if not torch.equal(top.sort(dim=-1).values, indices.sort(dim=-1).values):
        return None
    for activation in ("softmax", "sigmoid"):
        for renormalised in (False, True):
            ratio = weights.double() / WeightRule(activation, renormalised, 1.0).weights(logits, indices)
            scale = float(ratio.flatten()[0])
            if scale > 0 and bool(((ratio - scale).abs() <= _RULE_TOLERANCE * scale).all()):
                return WeightRule(activation, renormalised, scale)
    return None


@dataclass(frozen=True, slots=True)
class Router:
    """A router verify can force, with the rule its weights follow."""

    module: torch.nn.Module
    rule: WeightRule
    top_k: int


def router_candidates(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The model's modules that look like a top-k router (a ``Router`` class with ``top_k``), by name: empty for a
    dense model. Whether each can be forced is read from its output (:func:`forceable`)."""
    return {
        name: module
        for name, module in model.named_modules()
        if "router" in type(module).__name__.lower()
        and isinstance(getattr(module, "top_k", None), int)
        and getattr(module, "topk_method", "greedy") == "greedy"
    }


@contextmanager
def recording(routers: dict[str, torch.nn.Module]) -> Iterator[dict[str, RouterOutput]]:
    """Collect what each router returned in one forward, by name (routers that return no ``(logits, weights,
    indices)`` are left out)."""
    recorded: dict[str, RouterOutput] = {}

    def hook(name: str) -> Callable[..., None]:
        def record(module: Any, args: Any, output: Any) -> None:
            if isinstance(output, tuple) and len(output) == 3:
                logits, weights, indices = (part.detach() for part in output)
                if weights.shape == indices.shape and not indices.is_floating_point():
                    k = indices.shape[-1]
                    recorded[name] = RouterOutput(
                        logits.reshape(-1, logits.shape[-1]), weights.reshape(-1, k), indices.reshape(-1, k)
                    )

        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in routers.items()]
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()


def forceable(recorded: dict[str, RouterOutput], candidates: dict[str, torch.nn.Module]) -> dict[str, Router]:
    """The recorded routers whose choices and weights follow a :class:`WeightRule`, by name."""
    routers = {}
    for name, output in recorded.items():
        rule = read_rule(output)
        if rule is not None:
            routers[name] = Router(candidates[name], rule, int(cast(Any, candidates[name]).top_k))
    return routers


def forceable_routers(model: torch.nn.Module, forward: Callable[[], Any]) -> dict[str, Router]:
    """The routers of ``model`` verify can force, read from their output in one ``forward`` of it."""
    candidates = router_candidates(model)
    with recording(candidates) as recorded:
        forward()
    return forceable(recorded, candidates)


@contextmanager
def forcing(router: Router, token: int, chosen: int, other: int) -> Iterator[None]:
    """Make ``router`` route flat token ``token`` to ``other`` instead of ``chosen``, with the weights its own rule
    gives that selection."""

    def force(module: Any, args: Any, output: Any) -> Any:
        logits, weights, indices = output
        flat = logits.reshape(-1, logits.shape[-1])
        indices = indices.clone()
        selection = indices.reshape(-1, indices.shape[-1])[token]
        selection[selection == chosen] = other
        weights = weights.clone()
        weights.reshape(-1, weights.shape[-1])[token] = router.rule.weights(flat[token], selection).to(weights.dtype)
        return logits, weights, indices

    handle = router.module.register_forward_hook(force)
    try:
        yield
    finally:
        handle.remove()


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


def near_ties(
    router_logits: dict[str, torch.Tensor],
    top_k: dict[str, int],
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
        k = top_k[name]
        if logits.shape[-1] <= k:
            continue
        scores = logits.double().reshape(rows, length, -1)[:, prompt_length - 1 :]
        values, experts = torch.topk(scores, k + 1, dim=-1)
        margin = (values[..., k - 1] - values[..., k]) / scores.pow(2).mean(-1).sqrt().clamp(min=1e-30)
        for row, step in (margin <= tolerance).nonzero().tolist():
            chosen, other = int(experts[row, step, k - 1]), int(experts[row, step, k])
            ties.append(NearTie(name, row, step, chosen, other, float(margin[row, step])))
    return sorted(ties, key=lambda tie: tie.margin)


class RoutedReference:
    """The reference's one forward pass by the higher-precision copy ``precise``, with its routers recorded: its logits,
    and from them the alternative routing at each router near-tie within whatever tolerance the judge arrives at.

    One copy and one forward serve both: the near-ties are read off the routers' logits of the
    very forward that gave the reference, and each alternative costs one more forward.
    """

    def __init__(
        self, precise: torch.nn.Module, forward: Callable[[], torch.Tensor], rows: int, prompt_length: int, steps: int
    ) -> None:
        candidates = router_candidates(precise)
        with recording(candidates) as recorded:
            self.logits = forward()  # [rows, steps, vocab] in float64
        self._routers = forceable(recorded, candidates)
        self._router_logits = {name: recorded[name].logits for name in self._routers}
        self._forward = forward if self._routers else None  # a model with no router to force keeps no copy alive
        self._rows, self._prompt_length, self._steps = rows, prompt_length, steps

    def alternatives(self, tolerance: float) -> list[Alternative]:
        """For each router near-tie within ``tolerance`` (nearest :data:`MAX_ALTERNATIVES`), the reference with the
        tied experts swapped (empty for a dense model or routers that cannot be forced)."""
        if self._forward is None:
            return []
        top_k = {name: router.top_k for name, router in self._routers.items()}
        ties = near_ties(self._router_logits, top_k, self._rows, self._prompt_length, self._steps, tolerance)
        length = self._prompt_length + self._steps - 1
        alternatives = []
        for tie in ties[:MAX_ALTERNATIVES]:
            token = tie.row * length + self._prompt_length - 1 + tie.step
            with forcing(self._routers[tie.router], token, tie.chosen, tie.other):
                alternatives.append(Alternative(tie, self._forward()[tie.row].double()))
        return alternatives
