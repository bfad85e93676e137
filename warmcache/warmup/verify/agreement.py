"""When a served decode agrees with the model: the criterion verify, the serving tests and the support matrix apply.

A decode served by compiled code (an AOTInductor package, a precompiled artifact,
a guarded ``generate()``) is compared with two things the model computes eagerly on
the same tokens (the prompt and everything the served decode generated):

* the **reference**: one eager forward over all of them (:func:`reference_logits`);
* the model's own **eager decode**, step by step as ``generate()`` runs it, made to
  pick the served tokens (:func:`eager_decode_logits`).

The eager decode is as right as the model is, yet it is not bitwise the reference
either (other matmul shapes round differently); how far it is, is how far this
model, in this dtype, at this depth, can be told apart from itself. So a served decode
agrees when, over every step of every row, with ``scale`` each step's logit RMS:

* **logits** (when known): its largest RMS distance to the reference is at most
  :data:`FACTOR` times the eager decode's (or :data:`FLOOR` ulps of the dtype, if more);
* **tokens**: the served token's reference logit is within :data:`FACTOR` times the
  eager decode's own reach of the reference's best (among the tokens the decode could
  pick: ``min_new_tokens`` forbids end-of-sequence). The eager reach is the larger of how
  far its own greedy choice fell below the best and twice its largest single-logit
  distance (a near-tie that close may go either way).

Why self-calibrated and not a fixed bfloat16 tolerance: the eager noise grows with
depth. Measured on Qwen3-0.6B's published config at real width, random weights, CPU,
97 steps to a 128-token cache (RMS distance to the reference, over the step's RMS):

* bfloat16, 2 layers: a package 1.45-1.51 %, the eager decode 0.87-0.89 %;
* bfloat16, 28 layers: a package 4.83-4.97 %, the eager decode 3.66-3.69 %;
* float32, 2 layers: 1.8e-6 and 1.7-1.9e-6; 28 layers: 5.8e-6 and 5.4e-6.

A correct package stays within 1-1.7× the eager decode's distance; a package bound to
another checkpoint's weights was 141 % off at every step (about 100× the eager figure),
and scaling one layer's MLP output by 5 % measured 3.0 % against the eager 0.9 % (2
layers, bfloat16): both fail. bfloat16 greedy tokens themselves part from eager
``generate()``'s after 2-19 steps at exact ties (logits of magnitude 16-32 are multiples
of 0.125), so "tokens equal" would fail correct packages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warmcache.modeling.generation import special_token_ids

if TYPE_CHECKING:
    import torch

#: How much further from the reference a served decode may be than the model's own eager decode.
FACTOR = 3.0
#: Distances below this many machine epsilons of the dtype always pass (an eager decode may match the reference
#: bitwise).
FLOOR = 2
_EPSILON = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def floor(dtype: str) -> float:
    """The smallest distance the criterion allows in ``dtype`` (``torch.bfloat16`` or ``bfloat16``), relative to the
    logit RMS."""
    return FLOOR * _EPSILON[dtype.removeprefix("torch.")]


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

    @property
    def allowed_logit_error(self) -> float:
        return max(FACTOR * self.eager_logit_error, floor(self.dtype))

    @property
    def allowed_token_deficit(self) -> float:
        return max(FACTOR * self.eager_token_reach, floor(self.dtype))

    @property
    def agrees(self) -> bool:
        logits_agree = self.logit_error is None or self.logit_error <= self.allowed_logit_error
        return logits_agree and self.token_deficit <= self.allowed_token_deficit

    def describe(self) -> str:
        """One line: the worst figures against what the eager decode allows, for a verdict or a table cell."""
        logits = (
            f"logits {self.logit_error:.2%} from eager (allowed {self.allowed_logit_error:.2%}), "
            if self.logit_error is not None
            else ""
        )
        ties = f", {self.near_ties} near-tie{'s' if self.near_ties != 1 else ''}" if self.near_ties else ""
        verdict = "agrees with" if self.agrees else f"differs from (worst at step {self.worst_step + 1})"
        return (
            f"{verdict} the model over {self.steps} steps in {self.dtype}: {logits}tokens within "
            f"{self.token_deficit:.2%} of the best "
            f"(allowed {self.allowed_token_deficit:.2%}; eager decode's own distance "
            f"{self.eager_logit_error:.2%}{ties})"
        )


def reference_logits(
    model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generated: torch.Tensor
) -> torch.Tensor:
    """The model's eager logits for each generated position, in one forward pass: ``[rows, steps, vocab]`` in float32.

    Over the prompt and the generated tokens (all but the last, whose successor nobody
    asked for), positions counted from each row's first unpadded token as ``generate()``
    counts them, so a left-padded row sees what it saw while decoding.
    """
    import torch

    steps = generated.shape[1]
    ids = torch.cat([prompt_ids, generated[:, :-1]], dim=1)
    mask = torch.cat([prompt_mask, prompt_mask.new_ones(generated[:, :-1].shape)], dim=1)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=steps, use_cache=False)
    return out.logits.float()


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


def eos_token_ids(model: torch.nn.Module) -> list[int]:
    """The end-of-sequence ids a decode with ``min_new_tokens`` to the cache's end may not pick, whatever they score."""
    return sorted(special_token_ids(model, ("eos_token_id",)))


def judge(
    reference: torch.Tensor,
    eager: torch.Tensor,
    tokens: torch.Tensor,
    dtype: str,
    served_logits: torch.Tensor | None = None,
    *,
    forbidden: Sequence[int] = (),
) -> Agreement:
    """Judge served ``tokens`` ``[rows, steps]`` (and, when known, their logits) against ``reference``, calibrated by
    ``eager``.

    ``reference``: :func:`reference_logits`; ``eager``: :func:`eager_decode_logits` on the
    same tokens; ``forbidden``: token ids the served decode could not pick (:func:`eos_token_ids`
    under ``min_new_tokens``), so the reference's best is taken among the others.
    """
    import torch

    reference, eager = reference.float(), eager.float().to(reference.device)
    scale = reference.pow(2).mean(-1).sqrt().clamp(min=torch.finfo(torch.float32).tiny)

    def distance(logits: torch.Tensor) -> torch.Tensor:
        return (logits.float().to(reference.device) - reference).pow(2).mean(-1).sqrt() / scale

    allowed = reference.clone()
    allowed[..., [i for i in forbidden if i < reference.shape[-1]]] = float("-inf")
    best = allowed.amax(-1)

    def deficit(chosen: torch.Tensor) -> torch.Tensor:
        return (best - reference.gather(-1, chosen[..., None].to(reference.device))[..., 0]) / scale

    served_deficit = deficit(tokens)
    eager_pick = torch.where(torch.isinf(allowed), float("-inf"), eager).argmax(-1)
    eager_reach = max(float(deficit(eager_pick).max()), 2 * float(((eager - reference).abs().amax(-1) / scale).max()))
    worst = served_deficit
    logit_error = None
    if served_logits is not None:
        error = distance(served_logits)
        logit_error = float(error.max())
        worst = torch.maximum(error, served_deficit)
    return Agreement(
        dtype=dtype.removeprefix("torch."),
        steps=int(tokens.shape[1]),
        logit_error=logit_error,
        eager_logit_error=float(distance(eager).max()),
        token_deficit=float(served_deficit.max()),
        eager_token_reach=eager_reach,
        near_ties=int((served_deficit > 0).any(dim=0).sum()),
        worst_step=int(worst.amax(dim=0).argmax()),
    )
