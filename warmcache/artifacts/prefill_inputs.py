"""The example inputs a bucket's prefill is exported on, derived from the decode call warmup captured.

The prefill is the decode step's computation on the whole prompt: the same inputs
(:func:`warmcache.modeling.decode_inputs.flatten`'s names, so one loader and one binding
serve both), with ``input_ids`` of the bucket's prompt length, the mask's query axis as long,
and the cache empty (zeros, write position 0). ``logits_to_keep=1``: only the last position's
logits are needed for the first token, and the vocabulary projection of every prompt
position would be most of a long vocabulary's prefill arithmetic.

A decode call with inputs the runtime cannot build without the model's code (recurrent
state, a sliding-window mask) gets no prefill package: its
bucket is served by ``ShapeGuard.generate`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warmcache.artifacts.step_inputs import (
    CACHE_PREFIX,
    FULL_ATTENTION_KIND,
    IDS,
    MASK,
    POSITIONS,
    attention_mask,
    is_mask,
    positions,
)
from warmcache.errors import UsageError

if TYPE_CHECKING:
    import torch

#: What the packaged prefill fixes beside the decode's scalars.
PREFILL_SCALARS = {"logits_to_keep": 1}
#: The per-layer cache parts a prefill can start from empty (attention layers; recurrent state is refused).
EMPTY_PARTS = ("keys", "values", "cumulative_length")


def prefill_unsupported(names: list[str]) -> str | None:
    """Why a step with these inputs has no packaged prefill (one line), or ``None``."""
    for name in names:
        if is_mask(name) and name.removeprefix(MASK).removeprefix(".") not in ("", FULL_ATTENTION_KIND):
            return f"the decode step takes {name}, a mask a prefill without the model's code does not build"
        if name in (IDS, POSITIONS) or is_mask(name):
            continue
        if name.startswith(CACHE_PREFIX) and name.rsplit(".", 1)[-1] in EMPTY_PARTS:
            continue
        return f"the decode step takes {name}, which a prefill without the model's code cannot build"
    if not any(is_mask(name) for name in names):  # BLOOM's, when generate() dropped an all-ones mask
        return "the decode step takes no attention mask (its model builds attention from the key length without one)"
    return None


def prefill_example(
    names: list[str], tensors: list[torch.Tensor], fixed: dict[str, Any], seq_len: int
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Example prefill inputs (in the decode's order) and the fixed scalars, from a decode call's."""
    import torch

    unsupported = prefill_unsupported(names)
    if unsupported:
        raise UsageError(f"prefill: {unsupported}")
    batch = int(tensors[names.index(IDS)].shape[0])
    slots = next(int(t.shape[-1]) for n, t in zip(names, tensors) if is_mask(n))
    real = torch.zeros((batch, slots), dtype=torch.bool)
    real[:, :seq_len] = True
    example: list[torch.Tensor] = []
    for name, tensor in zip(names, tensors):
        if name == IDS:
            example.append(torch.ones((batch, seq_len), dtype=tensor.dtype, device=tensor.device))
        elif name == POSITIONS:
            example.append(positions(real[:, :seq_len]).to(tensor.device))
        elif is_mask(name):
            example.append(attention_mask(real, 0, seq_len, tensor.dtype, name).to(tensor.device))
        else:
            example.append(torch.zeros_like(tensor))
    return example, {**fixed, **PREFILL_SCALARS}
