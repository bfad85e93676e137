"""When a served decode agrees with the model: the criterion verify and the support matrix apply.

A decode served by compiled code (an AOTInductor package, a precompiled artifact,
a guarded ``generate()``) is judged against the model's own eager forward over the
same tokens: the prompt and everything the served decode generated, in one pass.
Each step is then compared on the same history, however early a near-tie made a
served greedy sequence part from the one eager decoding would have produced.

Per step of every row, with ``scale`` the root-mean-square of the reference's logits:

* **logits**: the root-mean-square of ``served - reference`` is at most
  ``tolerance(dtype) × scale`` (when the served logits are known);
* **tokens**: the served token's reference logit is within ``tolerance(dtype) × scale``
  of the reference's best among the tokens the decode could pick (a decode held to
  ``min_new_tokens`` cannot pick end-of-sequence), so a near-tie may go either way and
  nothing else may.

Why this and not "tokens equal": bfloat16 cannot tell near-ties apart. Measured on
Qwen3-0.6B's published config at real width (2 layers, CPU, torch 2.13, 97 steps to a
128-token cache): bfloat16 logits of magnitude 16-32 are multiples of 0.125, exact
top-2 ties are common, and an AOTInductor package's greedy tokens parted from eager
``generate()``'s after 2-19 steps, while every step stayed within 1.2-1.5 % (RMS) of
eager's logits on the same history. In float32 the package's logits equalled eager's.
A package bound to another checkpoint's weights was 141 % off at every step, so the
bfloat16 tolerance of 4 % leaves room on both sides; it does not claim to see an
error smaller than bfloat16's own rounding (scaling one layer's MLP output by 5 %
measured 2.8-3.0 %, inside it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Largest error, relative to the step's logit RMS, a correct decode shows in each dtype.
TOLERANCE = {"float32": 1e-3, "float16": 1e-2, "bfloat16": 4e-2}


def tolerance(dtype: str) -> float:
    """The criterion's relative tolerance for a model loaded in ``dtype`` (``torch.bfloat16`` or ``bfloat16``)."""
    return TOLERANCE[dtype.removeprefix("torch.")]


@dataclass(frozen=True, slots=True)
class Agreement:
    """How far a served decode was from the model's eager logits, at its worst step."""

    dtype: str
    steps: int
    """Decode steps judged per row."""
    logit_error: float | None
    """Largest per-step RMS of ``served - reference`` over the step's logit RMS (``None``: only tokens were served)."""
    token_deficit: float
    """Largest gap between the reference's best logit and the served token's, over the step's logit RMS."""
    near_ties: int
    """Steps where the served token was not the reference's best but within tolerance of it."""
    worst_step: int

    @property
    def tolerance(self) -> float:
        return tolerance(self.dtype)

    @property
    def agrees(self) -> bool:
        return self.token_deficit <= self.tolerance and (self.logit_error is None or self.logit_error <= self.tolerance)

    def describe(self) -> str:
        """One line: the worst figures against the tolerance, for a verdict or a table cell."""
        measured = f"logits within {self.logit_error:.2%}, " if self.logit_error is not None else ""
        ties = f", {self.near_ties} near-tie{'s' if self.near_ties != 1 else ''}" if self.near_ties else ""
        verdict = "agrees with" if self.agrees else f"differs from (worst at step {self.worst_step + 1})"
        return (
            f"{verdict} eager over {self.steps} steps: {measured}tokens within {self.token_deficit:.2%} of the best "
            f"(tolerance {self.tolerance:.1%} of the logit RMS in {self.dtype}{ties})"
        )


def reference_logits(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
    """The model's eager logits for each generated position, on the served history: ``[rows, steps, vocab]`` in float32.

    One forward over prompt and generated tokens (all but the last, whose successor
    nobody asked for), positions counted from each row's first unpadded token as
    ``generate()`` counts them, so a left-padded row sees what it saw while decoding.
    """
    import torch

    steps = generated.shape[1]
    ids = torch.cat([prompt_ids, generated[:, :-1]], dim=1)
    mask = torch.cat([prompt_mask, prompt_mask.new_ones(generated[:, :-1].shape)], dim=1)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=steps, use_cache=False)
    return out.logits.float()


def eos_token_ids(model: torch.nn.Module) -> list[int]:
    """The end-of-sequence ids a decode with ``min_new_tokens`` to the cache's end may not pick, whatever they score."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "eos_token_id", None)
        ids.update([value] if isinstance(value, int) else [v for v in value or () if isinstance(v, int)])
    return sorted(ids)


def judge(reference: torch.Tensor, tokens: torch.Tensor, dtype: str, served_logits: torch.Tensor | None = None, *, forbidden: Sequence[int] = ()) -> Agreement:
    """Judge served ``tokens`` ``[rows, steps]`` (and, when known, their logits) against ``reference`` (:func:`reference_logits`).

    ``forbidden``: token ids the served decode was not allowed to pick (:func:`eos_token_ids`
    under ``min_new_tokens``); the reference's best is taken among the others.
    """
    import torch

    reference = reference.float()
    scale = reference.pow(2).mean(-1).sqrt().clamp(min=torch.finfo(torch.float32).tiny)
    chosen = reference.gather(-1, tokens[..., None].to(reference.device))[..., 0]
    allowed = reference.clone()
    allowed[..., [i for i in forbidden if i < reference.shape[-1]]] = float("-inf")
    best = allowed.amax(-1)
    deficit = (best - chosen) / scale
    worst = deficit
    logit_error = None
    if served_logits is not None:
        error = (served_logits.float().to(reference.device) - reference).pow(2).mean(-1).sqrt() / scale
        logit_error = float(error.max())
        worst = torch.maximum(error, deficit)
    return Agreement(
        dtype=dtype.removeprefix("torch."),
        steps=int(tokens.shape[1]),
        logit_error=logit_error,
        token_deficit=float(deficit.max()),
        near_ties=int((deficit > 0).any(dim=0).sum()),
        worst_step=int(worst.amax(dim=0).argmax()),
    )
