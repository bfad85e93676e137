"""When a served decode agrees with the model: the criterion verify, the serving tests and the support matrix apply.

A decode served by compiled code (an AOTInductor package, a precompiled artifact,
a guarded ``generate()``) is compared with two things computed on the same tokens (the
prompt and everything the served decode generated):

* the **reference**: one forward over all of them by a copy of the model in higher
  precision (:data:`.reference.REFERENCE_DTYPE`: float64 for a float32 model, float32 for
  bfloat16 and float16; :func:`.reference.reference_logits`), as near the exact result as the
  model lets it be;
* the model's own **eager decode** in its own dtype, step by step as ``generate()`` runs
  it, made to pick the served tokens (:func:`eager_decode_logits`).

How far the eager decode is from the reference is how much rounding this model, in this
dtype, at this depth, carries: a right compiled decode rounds as much, in another order.
So a served decode agrees when, over every step of every row, with ``scale`` each step's
logit RMS:

* **logits** (when known): its largest RMS distance to the reference is at most
  :data:`FACTOR` times the eager decode's, and its mean over every step at most
  :data:`MEAN_FACTOR` times the eager decode's mean, each or the floor if more
  (:func:`floor`): what the dtype's rounding and float32 accumulation over the model's
  depth and width reach on their own. One step's distance is noisy, so its bound is loose; the
  mean over tens of steps is not, and a wrong layer moves every step: at one real-width
  layer in bfloat16, a 5 % change reaches only about twice the eager decode's distance;
* **tokens**: the served token's reference logit is within :data:`FACTOR` times the
  eager decode's own reach of the reference's best (among the tokens the decode could
  pick: ``min_new_tokens`` forbids end-of-sequence). The eager reach is the larger of how
  far its own greedy choice fell below the best and twice its largest single-logit
  distance (a near-tie that close may go either way);
* **routes** (a mixture of experts): a step may instead agree with the reference computed
  with the other expert at a router near-tie (:mod:`.routing`); taken at so many near-ties
  that a right decode would take as many at a chance under
  :data:`.reroutes.REROUTE_SIGNIFICANCE` (:func:`.reroutes.reroute_chances`), the other expert
  makes the decode differ.

Why a higher-precision reference: a reference in the model's own dtype is one more
rounding of the same sums, and on a CPU whose kernels round the one-pass forward and the
decode alike (a Xeon with AMX; ``ATEN_CPU_CAPABILITY=default``) the eager decode matched
it to the last bit, the bound collapsed to its floor, and a right package whose kernels
sum in another order failed ("0.00 % (allowed 0.00 %)", issue 36). Against the float64
reference a float32 eager decode is about 1e-6 away (12-20 epsilons at real width), never 0.
The figures that chose the factor and the floor are in docs/measurements/criterion.md.

The bounds and the verdict are here; the distances they bound are measured in
:mod:`.distances`, the chance of each router near-tie in :mod:`.reroutes`, and what the
floor reads off the model in :mod:`.model_traits`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from warmcache.warmup.verify.distances import logit_scale, per_routing
from warmcache.warmup.verify.model_traits import eos_token_ids, model_size
from warmcache.warmup.verify.reference import routed_reference
from warmcache.warmup.verify.reroutes import REROUTE_SIGNIFICANCE, chance_of_at_least, reroute_chances
from warmcache.warmup.verify.routing import Alternative, RoutedReference

if TYPE_CHECKING:
    import torch

#: How much further from the reference a served decode may be than the model's own eager decode: a right Inductor
#: decode measured 0.8-1.1 times it, one of two layers' MLP scaled by 1.05 2.2-3 times it in bfloat16
#: (docs/measurements/criterion.md).
FACTOR = 2.0
#: How much further from the reference, on average over every step of every row, a served decode may be than the
#: eager decode: a right decode's mean measured 0.7-1.2 times the eager mean at real width (tiny float32 models
#: scatter up to 2.25 times it, far below :data:`ACCUMULATION_EPSILONS`' floor), a 5 % change in one real-width layer
#: 2.3-3.5 times it in bfloat16 (docs/measurements/criterion.md).
MEAN_FACTOR = 1.75
#: Distances below this many machine epsilons of the dtype, times the square root of the model's depth, always pass:
#: each layer rounds its output to the dtype once more.
FLOOR_EPSILONS = 1.0
#: And below this many float32 epsilons times the square root of depth × width: every kernel accumulates in float32,
#: a dot product of ``width`` terms rounds about ``sqrt(width)`` epsilons in an order each kernel picks, and where
#: a step's sums cancel, many more. Right tiny float32 decodes (64 wide, 2 layers, Inductor) spiked to 6.2 times
#: ``sqrt(depth * width)`` epsilons at one step while the eager decode happened to land near the reference
#: (200 decodes; docs/measurements/criterion.md).
ACCUMULATION_EPSILONS = 16.0
_EPSILON = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def floor(dtype: str, depth: int = 1, width: int = 1) -> float:
    """The smallest distance the criterion allows in ``dtype`` (``torch.bfloat16`` or ``bfloat16``) for a model of
    ``depth`` layers of ``width`` (its hidden size), relative to the logit RMS: the dtype's own rounding and float32
    accumulation's, each as far as it reaches with no fault at all."""
    rounding = FLOOR_EPSILONS * _EPSILON[dtype.removeprefix("torch.")] * max(depth, 1) ** 0.5
    return rounding + accumulation_floor(depth, width)


def accumulation_floor(depth: int, width: int) -> float:
    """How far float32 accumulation alone moves the logits of a model of ``depth`` layers of ``width``, relative to
    their RMS: :data:`ACCUMULATION_EPSILONS` float32 epsilons per square root of depth × width."""
    return ACCUMULATION_EPSILONS * _EPSILON["float32"] * (max(depth, 1) * max(width, 1)) ** 0.5


def figure(value: float) -> str:
    """A relative distance a reader can read: a percentage down to 0.1 %, scientific notation below."""
    if value == 0:
        return "0"
    return f"{value:.2%}" if value >= 1e-3 else f"{value:.1e}"


@dataclass(frozen=True, slots=True)
class Agreement:
    """How far a served decode was from the reference, beside how far the model's own eager decode was."""

    dtype: str
    steps: int
    """Decode steps judged per row."""
    logit_error: float | None
    """Largest per-step RMS of ``served - reference`` over the step's logit RMS (``None``: only tokens were served)."""
    eager_logit_error: float
    """The same for the eager decode: this model's own distance to the reference."""
    token_deficit: float
    """Largest gap between the reference's best logit and the served token's, over the step's logit RMS."""
    eager_token_reach: float
    """How far below the best the eager decode could legitimately pick (see the module docstring)."""
    near_ties: int
    """Steps where the served token was not the reference's best."""
    worst_step: int
    """The step (0-based) where the served decode was furthest from the reference, named in a failure."""
    mean_logit_error: float | None = None
    """:attr:`logit_error`'s mean over every step of every row, rather than its largest."""
    eager_mean_logit_error: float = 0.0
    """The same for the eager decode."""
    depth: int = 1
    """The model's decoder layers: the floor grows as its square root."""
    width: int = 1
    """The model's hidden size: float32 accumulation's share of the floor grows as its square root."""
    rerouted_steps: int = 0
    """Steps (over all rows) that agreed only with the reference routed the other way at a router near-tie."""
    eager_rerouted_steps: int = 0
    """Steps where the eager decode itself was beyond the bound of the reference and nearer the other routing."""
    router_ties: int = 0
    """Router near-ties whose other routing was computed (:mod:`.routing`)."""
    rerouted_ties: int = 0
    """Of those, the ties the served decode took the other way at."""
    expected_reroutes: float = 0.0
    """How many of those ties a right decode takes the other way on average (:func:`.reroutes.reroute_chances`)."""
    reroute_chance: float = 1.0
    """The chance that a right decode takes the other way at :attr:`rerouted_ties` ties or more."""

    @property
    def floor(self) -> float:
        return floor(self.dtype, self.depth, self.width)

    @property
    def allowed_logit_error(self) -> float:
        return max(FACTOR * self.eager_logit_error, self.floor)

    @property
    def allowed_mean_logit_error(self) -> float:
        return max(MEAN_FACTOR * self.eager_mean_logit_error, self.floor)

    @property
    def allowed_token_deficit(self) -> float:
        return max(FACTOR * self.eager_token_reach, self.floor)

    @property
    def agrees(self) -> bool:
        logits_agree = self.logit_error is None or self.logit_error <= self.allowed_logit_error
        mean_agrees = self.mean_logit_error is None or self.mean_logit_error <= self.allowed_mean_logit_error
        routes_agree = self.reroute_chance >= REROUTE_SIGNIFICANCE
        return logits_agree and mean_agrees and routes_agree and self.token_deficit <= self.allowed_token_deficit

    def describe(self) -> str:
        """One line: the worst figures against what the eager decode allows, for a verdict or a table cell."""
        logits = (
            f"logits {figure(self.logit_error)} from the reference (allowed {figure(self.allowed_logit_error)}), "
            f"{figure(self.mean_logit_error or 0)} on average (allowed {figure(self.allowed_mean_logit_error)}), "
            if self.logit_error is not None
            else ""
        )
        ties = f", {self.near_ties} near-tie{'s' if self.near_ties != 1 else ''}" if self.near_ties else ""
        rerouted = (
            f"; {self.rerouted_steps} step{'s' if self.rerouted_steps != 1 else ''} matched an alternative routing "
            f"at a router near-tie (the eager decode: {self.eager_rerouted_steps}): the other expert at "
            f"{self.rerouted_ties} of {self.router_ties} near-ties, where a right decode takes it at "
            f"{self.expected_reroutes:.1f} on average and at as many or more with chance {figure(self.reroute_chance)}"
            f" (allowed {figure(REROUTE_SIGNIFICANCE)})"
            if self.rerouted_steps or self.eager_rerouted_steps
            else ""
        )
        verdict = "agrees with" if self.agrees else f"differs from (worst at step {self.worst_step + 1})"
        return (
            f"{verdict} the model over {self.steps} steps in {self.dtype}: {logits}tokens within "
            f"{figure(self.token_deficit)} of the best "
            f"(allowed {figure(self.allowed_token_deficit)}; eager decode's own distance "
            f"{figure(self.eager_logit_error)}, floor {figure(self.floor)}{ties}){rerouted}"
        )


class _Forced:
    """A logits processor that makes ``generate()`` pick the given tokens, one column per step (its raw logits stay
    as computed)."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self._tokens = tokens
        self._step = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import torch

        forced = torch.full_like(scores, float("-inf"))
        forced[torch.arange(scores.shape[0]), self._tokens[:, self._step].to(scores.device)] = 0
        self._step += 1
        return forced


def eager_decode_logits(
    model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generated: torch.Tensor, **generate_kwargs: Any
) -> torch.Tensor:
    """The model's own eager ``generate()`` decode over the served tokens: the raw logits of each step, ``[rows, steps,
    vocab]`` in float32.

    ``generate_kwargs``: the served call's own (its cache, ``max_cache_len``...), so the
    eager decode runs the same cache code; compilation is turned off.
    """
    import torch
    from transformers import LogitsProcessorList

    steps = generated.shape[1]
    kwargs = {**generate_kwargs, "max_new_tokens": steps, "min_new_tokens": steps, "do_sample": False}
    with torch.no_grad():
        out = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            logits_processor=LogitsProcessorList([_Forced(generated)]),
            output_logits=True,
            return_dict_in_generate=True,
            disable_compile=True,
            **kwargs,
        )
    return torch.stack(out.logits, dim=1).float()


def judge(
    reference: torch.Tensor,
    eager: torch.Tensor,
    tokens: torch.Tensor,
    dtype: str,
    served_logits: torch.Tensor | None = None,
    *,
    forbidden: Sequence[int] = (),
    depth: int = 1,
    width: int = 1,
    alternatives: Sequence[Alternative] = (),
) -> Agreement:
    """Judge served ``tokens`` ``[rows, steps]`` (and, when known, their logits) against ``reference``, calibrated by
    ``eager``.

    ``reference``: :func:`.reference.reference_logits`; ``eager``: :func:`eager_decode_logits` on the
    same tokens; ``forbidden``: token ids the served decode could not pick (:func:`.model_traits.eos_token_ids`
    under ``min_new_tokens``), so the reference's best is taken among the others;
    ``depth``, ``width``: the model's decoder layers and hidden size (:func:`.model_traits.model_size`), for the floor;
    ``alternatives``: :meth:`.routing.RoutedReference.alternatives`: a step of a row at or after a router
    near-tie agrees when it is within both bounds of the reference or of the routing with
    the tied experts swapped.
    """
    import torch

    reference = reference.double()
    eager = eager.double().to(reference.device)
    routings = per_routing(reference, logit_scale(reference), eager, tokens, served_logits, forbidden, alternatives)
    # The eager decode is measured against the routing it took: its own rounding, not one expert more or less.
    eager_routing = routings.eager.argmin(0, keepdim=True)
    eager_error = routings.eager.gather(0, eager_routing)[0]
    eager_reach_steps = torch.maximum(
        routings.eager_pick.gather(0, eager_routing)[0], 2 * routings.eager_max.gather(0, eager_routing)[0]
    )
    bounds = Agreement(
        dtype=dtype.removeprefix("torch."),
        steps=int(tokens.shape[1]),
        logit_error=None,
        eager_logit_error=float(eager_error.max()),
        eager_mean_logit_error=float(eager_error.mean()),
        token_deficit=0,
        eager_token_reach=float(eager_reach_steps.max()),
        near_ties=0,
        worst_step=0,
        depth=depth,
        width=width,
    )
    matches = (routings.error <= bounds.allowed_logit_error) & (routings.deficit <= bounds.allowed_token_deficit)
    # A served step is judged against the reference unless it fails there and matches an alternative routing.
    served_routing = torch.where(matches[0] | ~matches.any(0), 0, matches.int().argmax(0))[None]
    error, served_deficit = (figures.gather(0, served_routing)[0] for figures in (routings.error, routings.deficit))
    worst = torch.maximum(error, served_deficit)
    chances = reroute_chances(alternatives, eager_error, bounds.floor, FACTOR)
    rerouted_ties = len(set(served_routing[served_routing > 0].tolist()))
    return replace(
        bounds,
        logit_error=float(error.max()) if served_logits is not None else None,
        mean_logit_error=float(error.mean()) if served_logits is not None else None,
        token_deficit=float(served_deficit.max()),
        near_ties=int((served_deficit > 0).any(dim=0).sum()),
        worst_step=int(worst.amax(dim=0).argmax()),
        rerouted_steps=int((served_routing > 0).sum()),
        eager_rerouted_steps=int(((eager_routing > 0) & (routings.eager[0] > bounds.allowed_logit_error)).sum()),
        router_ties=len(alternatives),
        rerouted_ties=rerouted_ties,
        expected_reroutes=sum(chances),
        reroute_chance=chance_of_at_least(rerouted_ties, chances),
    )


def judge_decode(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    generated: torch.Tensor,
    eager: torch.Tensor,
    served_logits: torch.Tensor | None = None,
    routed: RoutedReference | None = None,
) -> Agreement:
    """:func:`judge` a served decode of ``model`` against its :func:`.reference.reference_logits`; for a mixture of
    experts, with the alternative routings at its router near-ties (:func:`.reference.routed_reference`, within the
    distance the served logits may have): a higher-precision forward each, at most :data:`.routing.MAX_ALTERNATIVES`.

    ``routed``: the model's :func:`.reference.routed_reference` over these tokens, when the
    caller judges several decodes of the same tokens (computed here otherwise).

    The eager decode's own distance is then measured at the routing it took, so one expert
    more or less in the eager decode no longer widens the bound every step is held to (gpt-oss
    at one real-width layer: 12.7 % at its one rerouted step, 1 % elsewhere).
    """
    dtype, forbidden, size = str(model.dtype), eos_token_ids(model), model_size(model)
    routed = routed or routed_reference(model, prompt_ids, prompt_mask, generated)

    def judged(alternatives: Sequence[Alternative] = ()) -> Agreement:
        return judge(
            routed.logits,
            eager,
            generated,
            dtype,
            served_logits,
            forbidden=forbidden,
            depth=size.depth,
            width=size.width,
            alternatives=alternatives,
        )

    agreement = judged()
    alternatives = routed.alternatives(agreement.allowed_logit_error)
    while alternatives:  # the eager distance at the routing it took tightens the bound: keep the ties within it
        agreement = judged(alternatives)
        within = [a for a in alternatives if a.tie.margin <= agreement.allowed_logit_error]
        if len(within) == len(alternatives):
            break
        alternatives = within
    return agreement
