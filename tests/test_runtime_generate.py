"""Guarded generate() on tiny Qwen3 and Llama (aot_eager): padding keeps greedy tokens, and nothing compiles after
prime."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_cli_query import _compile_all  # the registry's real claim → mark_compiled path
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.errors import UnseenShapeError, UsageError
from warmcache.modeling.compile_counter import CompileCounter
from warmcache.modeling.generation import compile_config, generate_kwargs
from warmcache.runtime.budget import reserve_recompile_room
from warmcache.runtime.guard import ShapeGuard
from warmcache.runtime.serving import PrimeReport
from warmcache.shapes.workload_settings import GenerateSettings

pytestmark = pytest.mark.slow

BATCH_SIZES = (1, 2, 4, 8)
PROMPT_LENGTHS = (8, 16)
MAX_CACHE_LEN = 32
MANIFEST = manifest_toml(
    model("m", "{path}", backend="aot_eager", generate=[generate(BATCH_SIZES, PROMPT_LENGTHS, MAX_CACHE_LEN)])
)
WORDS = "the a compile cache warm shape batch token neuron graph model train serve guard pad bucket fast slow".split()


@dataclass
class Served:
    guard: ShapeGuard
    model: Any
    tokenizer: Any
    primed: PrimeReport


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def served(
    request: pytest.FixtureRequest, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp(f"served-{request.param}")
    path = tiny_models[request.param]
    manifest = root / "manifest.toml"
    manifest.write_text(MANIFEST.replace("{path}", str(path)))
    url = f"sqlite:///{root / 'registry.sqlite'}"
    _compile_all(url, manifest)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch._dynamo.config.recompile_limit = 2  # below the bucket count: prime must raise it
    guard = ShapeGuard.from_registry(url, "m", telemetry=False)
    report = guard.prime(model)
    yield Served(guard, model, tokenizer, report)
    guard.close()
    torch._dynamo.reset()  # the next model starts with Dynamo as a fresh process has it


def _prompts(rng: random.Random, count: int, min_words: int, max_words: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))) for _ in range(count)]


def _unguarded(model: Any, max_new_tokens: int, **inputs: Any) -> Any:
    """The call a user would make without the guard: the same compiled settings, the caller's own shapes."""
    kwargs = generate_kwargs(
        GenerateSettings(MAX_CACHE_LEN),
        max_new_tokens=max_new_tokens,
        config=compile_config("aot_eager", "default", "cpu"),
        model_config=model.config,
    )
    return model.generate(**inputs, **kwargs)


def test_prime_loads_every_bucket_and_raises_the_recompile_limit(served: Served) -> None:
    import torch

    assert served.primed.buckets == [(b, n) for b in BATCH_SIZES for n in PROMPT_LENGTHS]
    assert served.primed.graphs == len(BATCH_SIZES)  # one decode graph per batch size; prefill runs eagerly
    assert torch._dynamo.config.recompile_limit >= len(served.primed.buckets)
    assert served.guard.primed


@pytest.mark.parametrize("padding", ["batch", "length"])
def test_padded_greedy_output_equals_unpadded(served: Served, padding: str) -> None:
    """Each row's greedy tokens equal those of the same prompt generated alone, without any padding."""
    rng = random.Random(7)
    if padding == "batch":  # 3 prompts of exactly a bucket length: only dummy rows are added (3 -> 4)
        import torch

        rows = [served.tokenizer(" ".join(rng.choice(WORDS) for _ in range(24)))["input_ids"][:16] for _ in range(3)]
        ids = torch.tensor(rows)
        encoded = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        expected_shape = (4, 16)
    else:  # 2 short prompts: only left padding columns are added (-> 16)
        encoded = served.tokenizer(_prompts(rng, 2, 3, 8), return_tensors="pt", padding=True)
        assert encoded["input_ids"].shape[1] not in PROMPT_LENGTHS
        expected_shape = (2, 16) if encoded["input_ids"].shape[1] > 8 else (2, 8)
    assert served.guard.fit(encoded).shape == expected_shape
    with CompileCounter() as counter:
        output = served.guard.generate(served.model, **encoded, max_new_tokens=8)
    assert counter.graphs == 0
    width = encoded["input_ids"].shape[1]
    assert output.shape[0] == encoded["input_ids"].shape[0]
    for row in range(output.shape[0]):
        mask = encoded["attention_mask"][row].bool()
        alone = encoded["input_ids"][row][mask].unsqueeze(0)
        reference = _unguarded(served.model, 8, input_ids=alone)[0, alone.shape[1] :]
        guarded = output[row, width:]
        assert guarded[: len(reference)].tolist() == reference.tolist()
        assert len(set(reference.tolist())) > 1  # random weights, yet not a constant output: the check has teeth


def test_replay_of_200_requests_compiles_nothing_with_the_guard(served: Served) -> None:
    rng = random.Random(3)
    stream = []
    for _ in range(200):
        batch = rng.randint(1, max(BATCH_SIZES))
        stream.append(
            served.tokenizer(
                _prompts(rng, batch, 1, 12), return_tensors="pt", padding=True, truncation=True, max_length=16
            )
        )
    assert {s["input_ids"].shape[0] for s in stream} == set(range(1, 9))
    with CompileCounter() as guarded:
        for inputs in stream:
            served.guard.generate(served.model, **inputs, max_new_tokens=2)
    # Without the guard, the stream's first 40 requests already compile graph after graph (all 200: 30 s more, the same
    # answer).
    with CompileCounter() as unguarded:
        for inputs in stream[:40]:
            _unguarded(served.model, 2, **inputs)
    print(
        f"\n200 requests, batch 1-8, prompt 1-16 tokens: {guarded.graphs} graphs compiled with "
        f"the guard, {unguarded.graphs} without it in the first 40"
    )
    assert guarded.graphs == 0
    assert unguarded.graphs > 1


def test_max_new_tokens_is_clipped_or_refused(served: Served) -> None:
    import torch

    inputs = served.tokenizer(["the compile cache warm shape"], return_tensors="pt")
    with CompileCounter() as counter:
        output = served.guard.generate(served.model, **inputs, max_new_tokens=100)
    assert counter.graphs == 0
    assert output.shape[1] - inputs["input_ids"].shape[1] <= MAX_CACHE_LEN - 8 + 1  # prompt bucket 8 leaves 25 tokens
    assert any(m.decision == "clip" and m.padded_seq == 8 for m in served.guard.misses())
    strict = ShapeGuard(lambda: served.guard.records, model="m", policy="refuse", source="test")
    with pytest.raises(
        UnseenShapeError,
        match=r"max_new_tokens=100 with prompt bucket seq=8 overflows the compiled max_cache_len=32 \(at most 25 fit\)",
    ):
        strict.generate(served.model, input_ids=torch.ones((2, 8), dtype=torch.long), max_new_tokens=100)
    with pytest.raises(UsageError, match="num_beams=4 differs from the compiled"):
        served.guard.generate(served.model, **inputs, num_beams=4)


def test_unservable_requests_are_refused_before_generate(served: Served) -> None:
    import torch

    too_many = torch.ones((9, 8), dtype=torch.long)
    with pytest.raises(
        UnseenShapeError, match="request batch=9 seq=8 fits no compiled shape; nearest compiled: batch=8 seq=8"
    ):
        served.guard.generate(served.model, input_ids=too_many)
    right_padded = {
        "input_ids": torch.ones((2, 5), dtype=torch.long),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
    }
    with pytest.raises(UsageError, match="right-padded"):
        served.guard.generate(served.model, **right_padded)
    with pytest.raises(UsageError, match=r"'input_ids' of shape \(0, 8\) is empty"):
        served.guard.fit({"input_ids": torch.ones((0, 8), dtype=torch.long)})
    with pytest.raises(UsageError, match="'attention_mask' must be a tensor of input_ids' shape"):
        served.guard.fit(
            {"input_ids": torch.ones((2, 8), dtype=torch.long), "attention_mask": torch.ones((2, 7), dtype=torch.long)}
        )


def test_warn_runs_an_unservable_request_unpadded_and_records_its_compile(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    lenient = ShapeGuard(lambda: served.guard.records, model="m", policy="warn", source="test")
    lenient.primed = True  # the buckets are loaded in this process (by the fixture's prime)
    # the replay's unguarded stream may have used the budget up: past it Dynamo runs eager, unseen
    reserve_recompile_room(1)
    ids = torch.full((9, 8), 5, dtype=torch.long)
    output = lenient.generate(served.model, input_ids=ids, max_new_tokens=2)
    assert output.shape == (9, 10)
    assert "request batch=9 seq=8 fits no compiled shape and will compile (policy warn)" in caplog.text
    assert "batch=9 seq=8 compiled 1 graph(s)" in caplog.text
    assert [(m.batch_size, m.decision) for m in lenient.misses()] == [(9, "warn")]
