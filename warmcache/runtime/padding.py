"""Fit a generate() batch onto a compiled bucket, and take the padding off the output again.

Left padding with attention-mask zeros is how decoder-only models batch prompts
of different lengths, so padding a prompt further on the left changes no real
token's output (measured on tiny Qwen3 and Llama: greedy tokens are equal).
Dummy rows that fill the batch up to a compiled batch size are copies of the
first real row, not empty rows: a fully masked row makes attention softmax over
nothing (NaN), and a copy finishes at the same EOS as its original, so dummy
rows never make generation run longer than the real rows need.

:meth:`FittedBatch.unpad` drops the dummy rows *and* the extra padding columns,
so the guarded output has exactly the shape (and, greedy, the tokens) the
unguarded ``generate()`` would have returned for the caller's own inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warmcache.errors import UsageError
from warmcache.shapes import Decision

if TYPE_CHECKING:
    import torch

    from warmcache.runtime.guarded import Guard


@dataclass(frozen=True)
class FittedBatch:
    """A batch on a compiled bucket plus what it takes to undo the padding."""

    inputs: dict[str, torch.Tensor]
    decision: Decision
    batch_size: int
    added_columns: int
    rows_per_input: int = 1

    @property
    def shape(self) -> tuple[int, int]:
        """The ``(batch, length)`` the model will see."""
        batch, length = self.inputs["input_ids"].shape
        return int(batch), int(length)

    def unpad(self, output: Any) -> Any:
        """Drop dummy rows and added left-padding columns from generate()'s output (a tensor or an output with
        ``sequences``)."""
        rows = self.batch_size * self.rows_per_input
        if hasattr(output, "sequences"):
            output.sequences = output.sequences[:rows, self.added_columns :]
            return output
        return output[:rows, self.added_columns :]


def fit_generate_inputs(guard: Guard, inputs: Mapping[str, Any], pad_token_id: int | None = None) -> FittedBatch:
    """Left-pad every ``(batch, length)`` tensor in ``inputs`` to the guard's bucket and add dummy rows.

    ``input_ids`` are padded with ``pad_token_id`` (default 0; the value is masked
    out, so it only matters to models that infer a mask from it), every other
    per-token tensor (``attention_mask``, ``token_type_ids``) with 0. A missing
    ``attention_mask`` means an unpadded batch. Right-padded batches are refused:
    decoder-only generation needs left padding, with or without the guard.
    """
    import torch

    tensors = _per_token_tensors(inputs)
    input_ids = tensors["input_ids"]
    batch, length = (int(n) for n in input_ids.shape)
    mask = tensors.setdefault("attention_mask", torch.ones_like(input_ids))
    if batch and bool((mask[:, -1] == 0).any()):
        raise UsageError(
            "generate inputs are right-padded (attention_mask ends in 0); tokenize with padding_side='left'"
        )
    decision = guard.decide(batch, length)
    rows_per_input = guard.family.generate.num_return_sequences
    if decision.target is None:
        return FittedBatch(tensors, decision, batch, 0, rows_per_input)
    target_batch, target_len = decision.target
    columns = target_len - length
    fitted: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        fill = (pad_token_id or 0) if name == "input_ids" else 0
        if columns:
            tensor = torch.cat([tensor.new_full((batch, columns), fill), tensor], dim=1)
        if target_batch > batch:
            tensor = torch.cat([tensor, tensor[:1].expand(target_batch - batch, -1)], dim=0)
        fitted[name] = tensor
    return FittedBatch(fitted, decision, batch, columns, rows_per_input)


def _per_token_tensors(inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    import torch

    if "input_ids" not in inputs:
        raise UsageError(f"generate inputs need 'input_ids' (got keys: {', '.join(inputs) or 'none'})")
    input_ids = inputs["input_ids"]
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise UsageError(
            "generate inputs: 'input_ids' must be a 2-D (batch, length) tensor; tokenize with return_tensors='pt'"
        )
    if 0 in input_ids.shape:
        raise UsageError(f"generate inputs: 'input_ids' of shape {tuple(input_ids.shape)} is empty")
    out: dict[str, torch.Tensor] = {}
    for name, value in inputs.items():
        if value is None:
            continue
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(input_ids.shape):
            raise UsageError(f"generate inputs: {name!r} must be a tensor of input_ids' shape {tuple(input_ids.shape)}")
        out[name] = value
    return out


def left_padded(ids: torch.Tensor, mask: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A bucket's prompt with its first row left-padded over half its length: a padded request of the bucket, as
    warmup, verify and ``prime`` run it (the attention mask keeps zeros, so generate() passes it on, where it drops an
    all-ones one)."""
    padded_ids, padded_mask = ids.clone(), mask.clone()
    lead = ids.shape[1] // 2
    padded_ids[0, :lead] = pad_id
    padded_mask[0, :lead] = 0
    return padded_ids, padded_mask
