"""Published configs at real width (depth cut to 2 layers) through the routes production takes: what the toys miss.

Real configs carry what the tiny test models do not: head_dim 128, rope_theta 1e6 and
``llama3`` rope scaling, vocabularies of 128-152k, tied embeddings whose rotary
``inv_freq`` is a non-persistent buffer, and bfloat16, the dtype Trainium serves. Here:

* Qwen3-0.6B (the Trainium guide's model) in bfloat16 through AOTInductor packages:
  warmup, verify (to the cache's end, under the bfloat16 criterion), then a fresh
  process serving ragged requests with no compiler imported and no Dynamo frame;
* the criterion itself, both sides: the right package passes, one bound to another
  checkpoint's weights fails;
* Llama-3.2-1B (``llama3`` rope scaling) in bfloat16 through Inductor warmup and verify.

Every config × route × dtype is ``python -m warmcache_testkit.support_matrix --real`` (its table is in
docs/measurements/architectures.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from warmcache_testkit.manifests import generate, manifest_toml, model
from warmcache_testkit.real_model import build_real_model, real_configs
from warmcache_testkit.serving_check import assert_served_by_packages, serve

from warmcache.registry import Registry

PROMPT = 16
MAX_CACHE_LEN = 40
#: One bucket of batch 2: a single request is padded onto it with a dummy row, a pair is left-padded.
BATCH = 2
REQUESTS = ((9,), (16, 5))


def _warm_and_verify(root: Path, declared: dict[str, Any]) -> dict[str, Any]:
    """The real ``warmcache warmup`` then ``warmcache verify`` (fresh processes); verify's JSON report."""
    manifest = root / "manifest.toml"
    manifest.write_text(
        manifest_toml(declared, registry={"url": f"sqlite:///{root}/registry.sqlite"}, cache={"dir": f"{root}/cache"})
    )
    reports = {}
    for command in ("warmup", "verify"):
        done = subprocess.run(
            [sys.executable, "-m", "warmcache", command, str(manifest), "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, f"{command}: {done.stdout[-2000:]} {done.stderr[-3000:]}"
        reports[command] = json.loads(done.stdout)
    return reports["verify"]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_real_model(real_configs()["Qwen__Qwen3-0.6B"], tmp_path_factory.mktemp("models") / "qwen3-0.6b")


@pytest.fixture(scope="module")
def qwen3_packaged(qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("qwen3-aoti")
    declared = model(
        "m",
        str(qwen3),
        dtype="bfloat16",
        backend="inductor",
        precompile="aotinductor",
        package_prefill=False,  # served through ShapeGuard.generate: the prefill's compile at real width is not needed
        generate=[generate([BATCH], [PROMPT], MAX_CACHE_LEN)],
    )
    return root, _warm_and_verify(root, declared)


@pytest.mark.slow
def test_qwen3_at_real_width_in_bfloat16_is_served_by_its_package_without_the_compiler(
    qwen3_packaged: tuple[Path, dict[str, Any]], qwen3: Path
) -> None:
    root, verified = qwen3_packaged
    assert [s["verdict"] for s in verified["specs"]] == ["verified"], verified
    served = serve(root, qwen3, REQUESTS, prompt=PROMPT, max_cache_len=MAX_CACHE_LEN, dtype="bfloat16")
    assert_served_by_packages(served, packages=1, min_calls=len(REQUESTS) * (MAX_CACHE_LEN - PROMPT))


def _served_by(package_root: Path, serving: Any, ids: Any) -> tuple[Any, Any]:
    """Greedy tokens and logits of ``serving`` decoding through the bucket's package, to the cache's end."""
    import torch

    from warmcache.artifacts.dispatch import install
    from warmcache.modeling.generation import compile_config, generate_kwargs, max_new_tokens_that_fit
    from warmcache.shapes.workload_settings import GenerateSettings

    with Registry.open(f"sqlite:///{package_root}/registry.sqlite") as registry:
        (row,) = registry.rows(model="m", with_artifacts=True)
    config = compile_config("inductor", "default", "cpu")
    install(serving, config, [row], root_override=None, strict=True)
    new = max_new_tokens_that_fit(PROMPT, MAX_CACHE_LEN)
    kwargs = generate_kwargs(
        GenerateSettings(MAX_CACHE_LEN), max_new_tokens=new, config=config, model_config=serving.config
    )
    with torch.no_grad():
        out = serving.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            min_new_tokens=new,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    return out.sequences[:, ids.shape[1] :], torch.stack(out.logits, dim=1)


@pytest.mark.slow
def test_bfloat16_criterion_passes_the_right_package_and_fails_one_bound_to_other_weights(
    qwen3_packaged: tuple[Path, dict[str, Any]], qwen3: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.warmup.verify.agreement import eager_decode_logits, judge
    from warmcache.warmup.verify.model_traits import eos_token_ids, model_size
    from warmcache.warmup.verify.reference import reference_logits

    root, _ = qwen3_packaged
    other = build_real_model(real_configs()["Qwen__Qwen3-0.6B"], tmp_path / "other", seed=1)
    right, wrong = (AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval() for path in (qwen3, other))
    ids = torch.randint(5, 300, (BATCH, PROMPT), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    verdicts = {}
    for name, serving in {"right": right, "wrong": wrong}.items():
        tokens, logits = _served_by(root, serving, ids)
        reference, eager = (
            reference_logits(right, ids, mask, tokens),
            eager_decode_logits(right, ids, mask, tokens, pad_token_id=0),
        )
        depth, width = model_size(right)
        verdicts[name] = judge(
            reference, eager, tokens, "bfloat16", logits, forbidden=eos_token_ids(right), depth=depth, width=width
        )
    assert verdicts["right"].agrees, verdicts["right"].describe()
    assert verdicts["right"].steps == MAX_CACHE_LEN - PROMPT + 1
    assert (
        not verdicts["wrong"].agrees
        and verdicts["wrong"].logit_error is not None
        and verdicts["wrong"].logit_error > 0.5
    ), verdicts["wrong"].describe()


@pytest.mark.slow
def test_llama_3_2_at_real_width_in_bfloat16_warms_and_verifies_through_inductor(tmp_path: Path) -> None:
    path = build_real_model(real_configs()["meta-llama__Llama-3.2-1B"], tmp_path / "llama-3.2-1b")
    declared = model("m", str(path), dtype="bfloat16", backend="inductor", generate=[generate([1], [8], 24)])
    verified = _warm_and_verify(tmp_path, declared)
    (spec,) = verified["specs"]
    assert spec["verdict"] == "verified" and spec["cache_misses"] == 0, spec


def test_prompt_ids_avoid_every_special_token_when_a_config_lists_several() -> None:
    """Gemma 3's published config has ``eos_token_id: [1, 106]``: the warmup's prompt builder hashed the list and failed
    every spec of the family ('TypeError: unhashable type: list') before anything compiled."""
    from types import SimpleNamespace

    from transformers import GenerationConfig, LlamaConfig

    from warmcache.warmup.workloads import token_ids

    config = LlamaConfig(vocab_size=8, bos_token_id=2, eos_token_id=[1, 6], pad_token_id=0)
    model = SimpleNamespace(config=config, generation_config=GenerationConfig(eos_token_id=[1, 6, 7]))
    ids = token_ids(model, 4, 64)  # type: ignore[arg-type]
    assert ids.shape == (4, 64) and set(ids.flatten().tolist()) == {3, 4, 5}
