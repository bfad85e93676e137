"""Drive the real ``generate()`` and the real ``Trainer`` step over one declared shape.

These are the calls production makes, built the same way (``warmcache.modeling.generation``
for generate, standard causal-LM batches for training), so the graphs compiled
here are the graphs production asks for. Both mask forms a runtime guard sends
are exercised: an unpadded batch and a padded one (left padding for generate,
right padding with labels -100 for training). Whether the padded form needs
graphs of its own is measured per spec and reported, not assumed.

torch and transformers are imported inside functions: this module is only
loaded by processes that compile.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, NamedTuple

from warmcache.errors import DecodeRecompileError
from warmcache.modeling.generation import DECODE_TOKENS, generate_kwargs, max_new_tokens_that_fit, special_token_ids
from warmcache.runtime.padding import left_padded
from warmcache.shapes import ShapeSpec
from warmcache.warmup.phases import NO_PHASES, DecodeSteps, Phase, SpecPhases

if TYPE_CHECKING:
    import torch
    from transformers import CompileConfig, PreTrainedModel

TRAIN_STEPS = 2
#: Seed for the synthetic token ids: a replay feeds the same tokens as the warmup.
SEED = 1234


@dataclass(frozen=True, slots=True)
class WorkloadResult:
    """What running one spec observed, beyond the counters the caller measures."""

    padded_graphs: int
    """Dynamo graphs the padded mask form added after the unpadded form ran (0: they share graphs)."""


def token_ids(model: PreTrainedModel, batch: int, length: int) -> torch.Tensor:
    """``batch × length`` ids drawn from the vocabulary, never a special token, same every run."""
    import torch

    special = special_token_ids(model, ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"))
    vocab = torch.tensor([i for i in range(model.config.vocab_size) if i not in special])
    generator = torch.Generator().manual_seed(SEED + 7919 * batch + length)
    return vocab[torch.randint(len(vocab), (batch, length), generator=generator)]


class BucketPrompt(NamedTuple):
    """A generate bucket's own call: its unpadded prompt, and the new tokens that fill its cache."""

    ids: torch.Tensor
    mask: torch.Tensor
    new_tokens: int


def bucket_prompt(model: PreTrainedModel, spec: ShapeSpec, device: Any = None) -> BucketPrompt:
    """The prompt warmup decodes a generate spec from (:func:`token_ids`, all unpadded), on ``device`` when given, and
    how many new tokens run its decode to the cache's end: what warmup runs and what verify proves."""
    import torch

    ids = token_ids(model, spec.batch_size, spec.seq_len)
    if device is not None:
        ids = ids.to(device)
    new_tokens = max_new_tokens_that_fit(spec.seq_len, spec.family.generate.max_cache_len)
    return BucketPrompt(ids, torch.ones_like(ids), new_tokens)


def pad_token_id(model: PreTrainedModel) -> int:
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "pad_token_id", None)
        if isinstance(value, int):
            return value
    return 0


def run_generate(
    model: PreTrainedModel,
    spec: ShapeSpec,
    config: CompileConfig,
    input_device: str,
    phases: SpecPhases = NO_PHASES,
    *,
    capture_only: bool = False,
) -> WorkloadResult:
    """Unpadded then left-padded ``generate()`` calls of exactly ``batch × prompt length``.

    Both forms first run a few tokens (compiling or loading the decode graphs), then
    decode until the cache is full under Dynamo's ``fail_on_recompile`` stance: a
    decode step that compiles again at a later position (a cache keeping its
    position in a Python int, a custom model) raises :class:`DecodeRecompileError`
    naming the guard, here, instead of recompiling at every step in production.
    Each decode to the cache's end reports its steps to ``phases``.

    ``capture_only``: the model decodes eagerly here because its production serves an
    AOTInductor package, never ``torch.compile``; nothing can recompile, so one short
    unpadded call (the one the package is exported from) is all there is to run. The
    package itself is proven to the cache's end by verify
    (:mod:`warmcache.warmup.verify.artifact_proof`). At real width the skipped eager
    decodes were most of such a warmup (42 of 71 s, Qwen3-0.6B's config, 2 layers).
    """
    import torch
    from transformers import GenerationMixin

    from warmcache.modeling.compile_counter import CompileCounter
    from warmcache.runtime.sentinel import fail_on_recompile

    assert isinstance(model, GenerationMixin), f"{type(model).__name__} cannot generate()"
    settings = spec.family.generate
    ids, mask, full_length = bucket_prompt(model, spec)
    pad_id = pad_token_id(model)

    def generate(
        input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int, streamer: DecodeSteps | None = None
    ) -> None:
        kwargs = generate_kwargs(settings, max_new_tokens=new_tokens, config=config, model_config=model.config)
        with torch.inference_mode():
            model.generate(
                input_ids=input_ids.to(input_device),
                attention_mask=attention_mask.to(input_device),
                # A random-weight (or any) model may emit EOS early; the decode steps must run.
                min_new_tokens=new_tokens,
                pad_token_id=pad_id,
                streamer=streamer,
                **kwargs,
            )

    forms = [(ids, mask)]
    generate(ids, mask, min(DECODE_TOKENS, full_length))
    if capture_only:
        return WorkloadResult(padded_graphs=0)
    padded_graphs = 0
    if spec.seq_len >= 2:  # a one-token prompt has no room for padding
        padded_ids, padded_mask = left_padded(ids, mask, pad_id)
        with CompileCounter() as padded:
            generate(padded_ids, padded_mask, min(DECODE_TOKENS, full_length))
        padded_graphs = padded.graphs
        forms.append((padded_ids, padded_mask))
    if full_length > DECODE_TOKENS:
        for form, (form_ids, form_mask) in zip(("unpadded", "left-padded"), forms):

            def recompiled(reason: str, form: str = form) -> DecodeRecompileError:
                return DecodeRecompileError(
                    f"{spec.describe()}: the {form} decode compiled again after its first steps (decoding "
                    f"{full_length} tokens "
                    f"to max_cache_len={settings.max_cache_len}); production would recompile at every "
                    f"position: {reason}"
                )

            # generate() refuses a streamer under beam search: the phase then shows no steps
            counted = settings.num_beams == 1
            phases.enter(Phase.DECODING, steps=full_length if counted else 0, detail=form)
            with fail_on_recompile(recompiled):
                generate(form_ids, form_mask, full_length, phases.decode_streamer() if counted else None)
    return WorkloadResult(padded_graphs=padded_graphs)


class _Rows:
    """A map-style dataset of ready causal-LM rows (the Trainer's default collator stacks them)."""

    def __init__(self, rows: list[dict[str, torch.Tensor]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.rows[index]


def training_rows(model: PreTrainedModel, batch: int, length: int) -> list[dict[str, torch.Tensor]]:
    """Two batches of exactly ``batch × length``: unpadded, then with the first row right-padded.

    Padding follows the guard's training collator: pad ids, attention 0, labels -100.
    """
    ids = token_ids(model, 2 * batch, length)
    mask = ids.new_ones(ids.shape)
    labels = ids.clone()
    if length >= 2:
        tail = length // 2
        ids[batch, -tail:] = pad_token_id(model)
        mask[batch, -tail:] = 0
        labels[batch, -tail:] = -100
    return [{"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]} for i in range(2 * batch)]


def run_train(
    model: PreTrainedModel, spec: ShapeSpec, device: str, backend: str, mode: str, phases: SpecPhases = NO_PHASES
) -> WorkloadResult:
    """Two real ``Trainer`` steps at exactly the spec's shape: an unpadded batch, then a padded one; each step
    reported to ``phases``."""
    from transformers import PrinterCallback, Trainer, TrainingArguments
    from transformers.utils import logging as transformers_logging

    settings = spec.family.train
    # accelerate compiles with dynamic=None (automatic dynamic shapes) unless told:
    # a second shape would then compile a symbolic graph that production never asks
    # for. Bucketed training wants one static graph per shape, as on Neuron.
    os.environ["ACCELERATE_DYNAMO_USE_DYNAMIC"] = "0"
    # accelerate returns a model it prepared before untouched, uncompiled: the second
    # spec of a model would silently train eagerly. Each spec's Trainer must prepare
    # and compile the model as a training job's one Trainer does.
    if getattr(model, "_is_accelerate_prepared", False):
        del model._is_accelerate_prepared
    rows = training_rows(model, spec.batch_size, spec.seq_len)
    with tempfile.TemporaryDirectory(prefix="warmcache-train-") as out:
        extra: dict[str, Any] = {"use_cpu": True} if device == "cpu" else {}
        extra[_checkpointing_argument(TrainingArguments)] = settings.gradient_checkpointing
        if backend == "inductor" and mode != "default":
            extra["torch_compile_mode"] = mode
        args = TrainingArguments(
            output_dir=out,
            torch_compile=True,
            torch_compile_backend=backend,
            dataloader_drop_last=True,
            train_sampling_strategy="sequential",
            max_steps=TRAIN_STEPS,
            per_device_train_batch_size=spec.batch_size,
            bf16=settings.bf16,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            **extra,
        )
        steps = _StepGraphs()
        trainer = Trainer(
            model=model, args=args, train_dataset=_Rows(rows), callbacks=[steps.callback(), _step_phases(phases)]
        )
        # quiet (warmup without --verbose): no metrics dict
        if transformers_logging.get_verbosity() > transformers_logging.WARNING:
            trainer.remove_callback(PrinterCallback)
        phases.enter(Phase.TRAINING, steps=TRAIN_STEPS)
        trainer.train()
    return WorkloadResult(padded_graphs=steps.padded_graphs)


def _checkpointing_argument(arguments: type) -> str:
    """``activation_checkpointing`` where the installed transformers has it (it warns on the old name), else
    ``gradient_checkpointing``."""
    names = {field.name for field in fields(arguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def _step_phases(phases: SpecPhases) -> Any:
    """A ``TrainerCallback`` telling ``phases`` each training step as it ends (the first one compiles)."""
    from transformers import TrainerCallback

    class StepPhases(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, *rest: Any, **kwargs: Any) -> None:
            phases.step(state.global_step)

    return StepPhases()


class _StepGraphs:
    """Counts Dynamo graphs per training step, to tell what the padded (second) batch added."""

    def __init__(self) -> None:
        from warmcache.modeling.compile_counter import CompileCounter

        self.counter = CompileCounter()
        self.after_first_step = 0
        self.padded_graphs = 0

    def callback(self) -> Any:
        from transformers import TrainerCallback

        owner = self

        class StepGraphs(TrainerCallback):
            def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
                owner.counter.__enter__()

            def on_step_end(self, args: Any, state: Any, *rest: Any, **kwargs: Any) -> None:
                owner.counter.update()
                if state.global_step == 1:
                    owner.after_first_step = owner.counter.graphs
                else:
                    owner.padded_graphs = owner.counter.graphs - owner.after_first_step

        return StepGraphs()
