"""Generation over packaged steps: a compiled prefill, then compiled decode steps, on a static cache of our own.

What ``generate()`` does for a guarded bucket, without transformers: the prompt (already
fitted to the bucket) goes through the bucket's prefill package, and each new token through
its decode package, with the inputs generate() would build (:mod:`warmcache.artifacts.step_inputs`).
Greedy tokens are generate()'s: the same packaged decode on the same inputs, and a prefill
exported from the same model whose logits equal the eager prefill's. Sampling draws from the
softmax of the logits divided by ``temperature``, within ``top_k`` and ``top_p``. A row stops at
any of ``stop_ids`` and is filled with ``pad_token_id`` from then on, as generate() does, and the
loop ends when every row has stopped or ``max_new_tokens`` are made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from warmcache.artifacts.step_inputs import CACHE_PREFIX, IDS, POSITIONS, attention_mask, is_mask, positions
from warmcache.errors import UsageError

if TYPE_CHECKING:
    import torch

    from warmcache.artifacts.aoti_loader import PackagedDecodeStep

#: Called with each step's new tokens, ``(batch,)``, as soon as they are chosen (streaming).
TokenCallback = Callable[["torch.Tensor"], None]


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedy (``do_sample`` false), or drawn from the tempered, truncated softmax."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    generator: Any = None
    """A ``torch.Generator`` for reproducible draws (default: torch's global one)."""

    def __post_init__(self) -> None:
        if self.temperature <= 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise UsageError(
                f"sampling: temperature={self.temperature} top_k={self.top_k} top_p={self.top_p} (need "
                "temperature > 0, top_k >= 0, 0 < top_p <= 1)"
            )

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token of each row from its ``(batch, vocab)`` logits."""
        import torch

        scores = logits.float()
        if not self.do_sample:
            return scores.argmax(-1)
        scores = scores / self.temperature
        if self.top_k:
            kth = torch.topk(scores, min(self.top_k, scores.shape[-1])).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p < 1:
            ordered, order = scores.sort(-1, descending=True)
            # Drop a token when the tokens more likely than it already hold top_p.
            before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)
            scores = scores.scatter(-1, order, ordered.masked_fill(before > self.top_p, float("-inf")))
        return torch.multinomial(scores.softmax(-1), 1, generator=self.generator).squeeze(-1)


@dataclass
class PackagedSteps:
    """One bucket's packages: its prompt's prefill and its batch's decode step (same inputs, same cache)."""

    prefill: PackagedDecodeStep
    decode: PackagedDecodeStep
    names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.names = [name for name, _, _ in self.decode.inputs]
        prefill_names = [name for name, _, _ in self.prefill.inputs]
        if prefill_names != self.names:
            raise UsageError(
                f"{self.prefill.where}: prefill inputs {prefill_names[:4]}… are not decode package "
                f"{self.decode.where}'s {self.names[:4]}…"
            )

    def generate(
        self,
        input_ids: torch.Tensor,
        real: torch.Tensor,
        max_new_tokens: int,
        *,
        stop_ids: frozenset[int] = frozenset(),
        pad_token_id: int = 0,
        sampling: Sampling = Sampling(),
        on_token: TokenCallback | None = None,
        on_logits: TokenCallback | None = None,
    ) -> torch.Tensor:
        """``(batch, length + new)``: the prompt (fitted to this bucket: left-padded, ``real`` its mask) and the tokens
        generated after it. ``on_logits`` is called with each step's ``(batch, vocab)`` logits (verify judges them)."""
        import torch

        batch, length = (int(n) for n in input_ids.shape)
        signature = {name: (shape, dtype) for name, shape, dtype in self.decode.inputs}
        slots = next(shape[-1] for name, (shape, _) in signature.items() if is_mask(name))
        if length + max_new_tokens - 1 > slots:
            raise UsageError(f"{length} + {max_new_tokens} new tokens overflow the packaged cache of {slots}")
        occupied = torch.zeros((batch, slots), dtype=torch.bool)
        occupied[:, :length] = real.bool()
        cache = {
            name: torch.zeros(shape, dtype=_dtype(dtype))
            for name, (shape, dtype) in signature.items()
            if name.startswith(CACHE_PREFIX)
        }
        with torch.inference_mode():
            logits = self._run(self.prefill, input_ids, occupied, 0, length, cache)
            tokens: list[torch.Tensor] = []
            unfinished = torch.ones(batch, dtype=torch.bool)
            stops = torch.tensor(sorted(stop_ids), dtype=torch.long)
            for step in range(max_new_tokens):
                if on_logits is not None:
                    on_logits(logits[:, -1])
                chosen = sampling.choose(logits[:, -1])
                chosen = torch.where(unfinished, chosen, pad_token_id)
                tokens.append(chosen)
                if on_token is not None:
                    on_token(chosen)
                unfinished &= ~torch.isin(chosen, stops)
                if step == max_new_tokens - 1 or not bool(unfinished.any()):
                    break
                slot = length + step
                occupied[:, slot] = True
                logits = self._run(self.decode, chosen[:, None], occupied, slot, 1, cache)
        return torch.cat([input_ids, torch.stack(tokens, dim=1)], dim=1)

    def _run(
        self,
        step: PackagedDecodeStep,
        ids: torch.Tensor,
        occupied: torch.Tensor,
        first: int,
        queries: int,
        cache: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        tensors: list[torch.Tensor] = []
        for name, _, dtype in step.inputs:
            if name == IDS:
                tensors.append(ids.contiguous())
            elif name == POSITIONS:
                tensors.append(positions(occupied[:, : first + queries])[:, first:].contiguous())
            elif is_mask(name):
                tensors.append(attention_mask(occupied, first, queries, _dtype(dtype), name))
            else:
                tensors.append(cache[name])
        return step.run(self.names, tensors, step.fixed)


def _dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name.removeprefix("torch."))
    assert isinstance(dtype, torch.dtype), name
    return dtype
