"""The tensors a packaged prefill or decode step takes, built with torch alone, as generate() builds them.

generate() hands its forward ``position_ids`` (real tokens counted from 0, so left padding shifts
no row's positions) and a prebuilt attention mask per call, shaped
``(batch, 1, queries, max_cache_len)``: query ``q`` (a cache slot) sees key ``k`` when
``k <= q`` and slot ``k`` holds a real token (left padding is not one). The cache is the
static cache taken apart (:mod:`warmcache.modeling.decode_inputs`): each layer's keys and
values, zero until written, and its write position ``cumulative_length``, which the package
advances in place. :mod:`warmcache.runtime.decode_loop` builds every call from these, and
warmup exports the prefill on the same tensors (:mod:`warmcache.artifacts.prefill_inputs`), so a
process that serves from packages needs neither transformers nor the model's code.

Imports torch only inside functions: the module is imported by processes before torch is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warmcache.errors import UsageError

if TYPE_CHECKING:
    import torch

#: The input names of a step, as :func:`warmcache.modeling.decode_inputs.flatten` writes them.
IDS = "input_ids"
POSITIONS = "position_ids"
MASK = "attention_mask"
CACHE_PREFIX = "cache."
#: Mask kinds a packaged step may take, beside a single mask: full attention at every layer.
FULL_ATTENTION_KIND = "full_attention"


def is_mask(name: str) -> bool:
    """Whether ``name`` is the step's attention mask (one tensor, or one of a dict's kinds)."""
    return name == MASK or name.startswith(MASK + ".")


def attention_mask(real: torch.Tensor, first: int, queries: int, dtype: torch.dtype, name: str = MASK) -> torch.Tensor:
    """The ``(batch, 1, queries, slots)`` mask of queries at slots ``first .. first+queries-1``.

    ``real``: ``(batch, slots)`` booleans, true where a slot holds a real token (written or to be).
    A boolean mask is what SDPA takes; a floating one is additive (0 or the dtype's minimum),
    as eager attention takes it. A mask kind other than full attention (a sliding window) is refused.
    """
    import torch

    kind = name.removeprefix(MASK).removeprefix(".")
    if kind not in ("", FULL_ATTENTION_KIND):
        raise UsageError(f"packaged step: attention mask kind {kind!r} is not served without the model's code")
    slots = real.shape[1]
    query = torch.arange(first, first + queries).view(1, 1, queries, 1)
    key = torch.arange(slots).view(1, 1, 1, slots)
    allowed = (key <= query) & real[:, None, None, :]
    if dtype == torch.bool:
        return allowed
    return torch.zeros((), dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min).expand_as(allowed).contiguous()


def positions(real: torch.Tensor) -> torch.Tensor:
    """generate()'s ``position_ids`` of every slot: real tokens count from 0, padding slots hold 1."""
    counted = real.long().cumsum(-1) - 1
    return counted.masked_fill(~real, 1)


def empty_cache_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """A cache input as the step finds it before the prefill: zeros (keys, values) and write position 0."""
    import torch

    return torch.zeros(shape, dtype=dtype, device=device)
