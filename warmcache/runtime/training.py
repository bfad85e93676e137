"""Training on compiled buckets: a data collator that pads every batch to one, and a Trainer callback that checks it.

A compiled training step is specialised to its ``(batch, length)``, so the
collator pads each batch on the right to the smallest compiled bucket that
fits: padding tokens get attention 0 and label -100, so they change neither the
loss nor the gradients. A short last batch gets dummy rows (pad tokens,
attention 0, labels -100) up to a compiled batch size instead of compiling a
new step. A batch longer than every bucket is truncated to the longest one
(policies ``pad``/``warn``) or refused (``refuse``).

The callback is the check for collators that are not the guard's: before each
forward of the training model it asserts the batch is an exactly compiled
bucket (a forward pre-hook, run outside the compiled graph), and it counts the
graphs compiled during every step, so a run can prove no step compiled after
the first pass over the buckets. During training it makes room for every bucket
in Dynamo's recompile budget and makes running out of it an error, not a silent
fall-back to eager (see :mod:`warmcache.runtime.budget`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback

from warmcache.errors import UnseenShapeError, UsageError
from warmcache.modeling.compile_counter import CompileCounter
from warmcache.runtime.budget import loud_recompile_limit, reserve_recompile_room
from warmcache.shapes import Decision

if TYPE_CHECKING:
    from warmcache.runtime.guarded import Guard

IGNORE_INDEX = -100


class BucketCollator:
    """``DataCollator`` for causal-LM training that emits only compiled ``(batch, length)`` buckets.

    Features are mappings with ``input_ids`` (and optionally ``labels``, default:
    the input ids, for causal-LM loss) as lists or 1-D tensors.
    """

    def __init__(self, guard: Guard, tokenizer: Any, *, pad_token_id: int | None = None) -> None:
        pad = pad_token_id if pad_token_id is not None else getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            raise UsageError("BucketCollator: the tokenizer has no pad_token_id; pass pad_token_id=")
        self.guard = guard
        self.pad_token_id = int(pad)

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        ids = [_as_list(f["input_ids"]) for f in features]
        labels = [_as_list(f["labels"]) if "labels" in f else row for f, row in zip(features, ids)]
        batch, length = len(ids), max(len(row) for row in ids)
        target_batch, target_len = self._bucket(batch, length)
        input_ids = torch.full((target_batch, target_len), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((target_batch, target_len), dtype=torch.long)
        label_ids = torch.full((target_batch, target_len), IGNORE_INDEX, dtype=torch.long)
        for i, (row, row_labels) in enumerate(zip(ids, labels)):
            n = min(len(row), target_len)
            input_ids[i, :n] = torch.tensor(row[:n])
            attention[i, :n] = 1
            label_ids[i, :n] = torch.tensor(row_labels[:n])
        return {"input_ids": input_ids, "attention_mask": attention, "labels": label_ids}

    def _bucket(self, batch: int, length: int) -> tuple[int, int]:
        guard = self.guard
        decision = guard.bucket(batch, length)
        if decision.kind == "pad":
            guard.telemetry.record(decision)
        if decision.target is not None:
            return decision.target
        longest = guard.longest_length(batch)
        if guard.policy == "refuse" or longest is None:
            guard.telemetry.record(decision, "refuse")
            raise UnseenShapeError(
                guard.unseen_message(decision, f"fits no compiled training shape (policy {guard.policy})")
            )
        truncated = guard.bucket(batch, longest)
        assert truncated.target is not None  # longest_length only returns lengths of buckets that hold the batch
        guard.telemetry.record(Decision("pad", batch, length, truncated.target), "truncate")
        return truncated.target


def _as_list(value: Any) -> list[int]:
    return value.tolist() if isinstance(value, torch.Tensor) else list(value)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One optimizer step: the batch shape its forward saw and the graphs compiled during it."""

    step: int
    shape: tuple[int, int] | None
    graphs: int


class GuardCallback(TrainerCallback):
    """Check each training batch against the guard before its forward; count compiles per step."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.steps: list[StepRecord] = []
        self._shape: tuple[int, int] | None = None
        self._counter = CompileCounter()
        self._training = ExitStack()  # what on_train_begin set up, undone by on_train_end

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise UsageError("GuardCallback: the Trainer passed no model to on_train_begin")
        self.close()  # a previous train() that raised never reached on_train_end
        self.guard.claim_compile_folder()
        # Disabled for Dynamo: the check runs eagerly before the compiled forward instead of being traced into it.
        hook = model.register_forward_pre_hook(torch.compiler.disable(self._check_batch), with_kwargs=True)
        self._training.callback(hook.remove)
        reserve_recompile_room(len(self.guard.buckets))
        self._training.enter_context(loud_recompile_limit())

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._shape = None
        self._counter.__enter__()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._counter.update()
        self.steps.append(StepRecord(state.global_step, self._shape, self._counter.graphs))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def close(self) -> None:
        """Remove the shape check and restore Dynamo's settings (``on_train_end`` does it too).

        The Trainer skips ``on_train_end`` when training raises, so long-lived
        processes use the callback as a context manager: ``with guard.callback() as cb:``.
        """
        self._training.close()

    def __enter__(self) -> GuardCallback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_batch(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not module.training:
            return
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            return
        batch, length = (int(n) for n in input_ids.shape[:2])
        self._shape = (batch, length)
        self.guard.require_exact(batch, length)
