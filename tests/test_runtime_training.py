"""Training on compiled buckets: the collator's padding rules, the callback's check, and a real compiled Trainer run."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from test_cli_query import _compile_all  # the registry's real claim → mark_compiled path
from warmcache_testkit.manifests import manifest_toml, model, train

from warmcache.errors import UnseenShapeError
from warmcache.runtime.guard import ShapeGuard
from warmcache.runtime.training import IGNORE_INDEX

MANIFEST = manifest_toml(model("m", "{llama}", backend="aot_eager", train=[train(seq_lengths=[16, 32])]))
WORDS = "the a compile cache warm shape batch token neuron graph model train serve guard pad bucket".split()


@pytest.fixture
def guard_url(tmp_path: Path, write_manifest) -> str:
    url = f"sqlite:///{tmp_path / 'registry.sqlite'}"
    _compile_all(url, write_manifest(MANIFEST))
    return url


def test_collator_pads_right_to_a_bucket_with_ignored_labels(guard_url: str) -> None:
    guard = ShapeGuard.from_registry(guard_url, "m", "train", telemetry=False)
    collate = guard.collator(None, pad_token_id=0)
    batch = collate([{"input_ids": [5, 6, 7]}, {"input_ids": list(range(10, 30))}])
    assert batch["input_ids"].shape == (2, 32)
    assert batch["input_ids"][0, :4].tolist() == [5, 6, 7, 0]
    assert batch["attention_mask"][0].sum() == 3 and batch["attention_mask"][1].sum() == 20
    assert batch["labels"][0, :4].tolist() == [5, 6, 7, IGNORE_INDEX]
    assert (batch["labels"][1, 20:] == IGNORE_INDEX).all()

    short_last = collate([{"input_ids": [5, 6], "labels": [IGNORE_INDEX, 6]}])  # a short last batch gets a dummy row
    assert short_last["input_ids"].shape == (2, 16)
    assert short_last["labels"][0, :3].tolist() == [IGNORE_INDEX, 6, IGNORE_INDEX]
    assert short_last["attention_mask"][1].sum() == 0 and (short_last["labels"][1] == IGNORE_INDEX).all()

    # policy pad: truncate to the longest bucket
    too_long = collate([{"input_ids": list(range(40))}, {"input_ids": [1]}])
    assert too_long["input_ids"].shape == (2, 32) and too_long["input_ids"][0, -1] == 31
    assert sorted(m.decision for m in guard.misses()) == ["pad", "pad", "truncate"]


def test_collator_and_callback_refuse_what_was_not_compiled(guard_url: str, tiny_models: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    guard = ShapeGuard.from_registry(guard_url, "m", "train", policy="refuse", telemetry=False)
    with pytest.raises(
        UnseenShapeError,
        match="request batch=2 seq=40 fits no compiled training shape .*nearest compiled: batch=2 seq=32",
    ):
        guard.collator(None, pad_token_id=0)([{"input_ids": list(range(40))}, {"input_ids": [1]}])
    with pytest.raises(UnseenShapeError, match="request batch=3 seq=5 fits no compiled training shape"):
        guard.collator(None, pad_token_id=0)([{"input_ids": [1] * 5}] * 3)

    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"])
    callback = guard.callback()
    callback.on_train_begin(None, None, None, model=model)
    model.train()
    with pytest.raises(UnseenShapeError, match="request batch=2 seq=10 is not a compiled bucket"):
        model(input_ids=torch.ones((2, 10), dtype=torch.long))
    model(input_ids=torch.ones((2, 16), dtype=torch.long))  # a compiled bucket passes
    callback.on_train_end(None, None, None)
    model(input_ids=torch.ones((2, 10), dtype=torch.long))  # the hook is gone after training

    # A train() that raises never reaches on_train_end: the context manager still cleans up,
    # and a second on_train_begin does not stack a second check on the first.
    with guard.callback() as failed_run:
        failed_run.on_train_begin(None, None, None, model=model)
        failed_run.on_train_begin(None, None, None, model=model)
        assert len(model._forward_pre_hooks) == 1
    assert not model._forward_pre_hooks
    model(input_ids=torch.ones((2, 10), dtype=torch.long))


@pytest.mark.slow
def test_compiled_training_stays_on_buckets_and_compiles_only_on_the_first_pass(
    guard_url: str, tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "0")  # static graph per bucket, as warmup compiles them
    torch._dynamo.reset()  # Dynamo as a fresh training process has it, whatever ran in this one before

    guard = ShapeGuard.from_registry(guard_url, "m", "train", telemetry=False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["llama"])
    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"], dtype=torch.float32)
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.choice([3, 5, 8, 12, 20, 30]))) for _ in range(11)]
    dataset = [{"input_ids": tokenizer(t)["input_ids"]} for t in texts]  # 11 rows: the last batch is short
    callback = guard.callback()
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        torch_compile=True,
        torch_compile_backend="aot_eager",
        per_device_train_batch_size=2,
        num_train_epochs=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=dataset, data_collator=guard.collator(tokenizer), callbacks=[callback]
    )
    trainer.train()

    steps = callback.steps
    print("\n" + "\n".join(f"step {s.step}: batch shape {s.shape}, graphs compiled {s.graphs}" for s in steps))
    assert len(steps) == 12
    assert all(s.shape in guard.buckets for s in steps)
    assert {s.shape for s in steps} == set(guard.buckets)  # both lengths were really exercised
    first_pass_done = max(next(i for i, s in enumerate(steps) if s.shape == bucket) for bucket in guard.buckets)
    assert all(s.graphs == 0 for s in steps[first_pass_done + 1 :])
    # one static graph per bucket, seen by the callback
    assert [s.graphs for s in steps[: first_pass_done + 1] if s.graphs] == [
        1,
        1,
    ]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 12 and all(math.isfinite(loss) for loss in losses)  # dummy rows (attention 0) stay harmless
