"""verify and prime cover the masks production sends: unpadded and left-padded requests of every bucket.

generate() drops an all-ones attention mask; BLOOM's decode call then lacks the mask that a
padded request's carries, so an artifact captured from the unpadded request (as warmup
captures it) cannot serve a padded one, and production would compile at its first padded
request. Here the artifact is a stand-in that serves exactly the captured call by running the
model (no compile: CI's time is short); the real route's padded proof runs in the suite's
AOTInductor verify (``tests/test_aotinductor.py``'s ``packaged``), where Llama's padded request
is served by the same package on every bucket.

On the compile routes warmup and verify's replay ran both requests already, but ``prime`` ran
the unpadded one only: BLOOM's padded decode graph then first traced at production's first
padded request, under the armed sentinel, and was refused. prime now runs both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from warmcache_testkit.family_sweep import build_family_model, tiny_config
from warmcache_testkit.manifests import generate, manifest_toml, model
from warmcache_testkit.registry_fill import mark_all_compiled

from warmcache.artifacts.capture import capture_decode_call
from warmcache.artifacts.dispatch import PrecompiledDecoder
from warmcache.artifacts.format import decode_signature
from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.modeling.compile_counter import CompileCounter
from warmcache.modeling.generation import compile_config, generate_kwargs
from warmcache.runtime.guard import ShapeGuard
from warmcache.shapes.workload_settings import GenerateSettings
from warmcache.warmup.verify.padded_request import serve_padded_request

SETTINGS = GenerateSettings(16)


def _served_by_the_unpadded_call(family: str) -> tuple[Any, PrecompiledDecoder, Any, Any]:
    """A tiny ``family`` model whose compiled call serves only the decode call of an unpadded ``2 × 8`` request."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(family)).eval()
    config = compile_config("inductor", "default", "cpu")
    ids = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    call = generate_kwargs(SETTINGS, max_new_tokens=2, config=config, model_config=model.config)
    with capture_decode_call(model, eager=True) as captured, torch.no_grad():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pad_token_id=0, min_new_tokens=2, **call)
    decoder = PrecompiledDecoder(model, fallback=lambda: pytest.fail("the decoder's fallback compiles"))
    decoder.by_signature[decode_signature(dict(captured))] = lambda m, **kwargs: type(m).__call__(m, **kwargs)
    model.get_compiled_call = lambda asked: decoder if asked is config else pytest.fail("another compile config")
    return model, decoder, config, ids


def test_an_artifact_of_the_unpadded_call_fails_bloom_whose_padded_call_carries_the_mask() -> None:
    model, decoder, config, ids = _served_by_the_unpadded_call("bloom")
    said = serve_padded_request(model, decoder, SETTINGS, config, ids, room=8)
    assert said == (
        "precompiled artifact does not serve a left-padded request of the bucket: its decode call has attention_mask "
        "beside the unpadded request's (generate() drops an all-ones attention mask, and this model's decode depends "
        "on whether it has one), so every padded request in production would compile and the guard would refuse it; "
        "serve this model through the compile cache (no precompile), whose warmup compiles both"
    )
    assert decoder.calls == 0


def test_llamas_padded_request_is_served_by_the_same_call_and_agrees() -> None:
    model, decoder, config, ids = _served_by_the_unpadded_call("llama")
    assert serve_padded_request(model, decoder, SETTINGS, config, ids, room=8) is None
    assert decoder.calls == 2  # the padded request's decode steps (3 new tokens: one from its prefill)


@pytest.mark.slow
def test_prime_runs_a_padded_request_too_so_blooms_first_ragged_request_compiles_nothing(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    path = build_family_model("bloom", tmp_path / "bloom")
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        manifest_toml(model("b", str(path), backend="aot_eager", generate=[generate([2], [8], max_cache_len=16)]))
    )
    url = f"sqlite:///{tmp_path}/registry.sqlite"
    mark_all_compiled(url, plan_manifest(load_manifest(manifest)))  # the rows warmup leaves; aot_eager compiles here
    bloom = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with ShapeGuard.from_registry(url, "b", telemetry=False) as guard:
        primed = guard.prime(bloom)
        assert primed.graphs == 2  # the decode without a mask and the decode with one
        ids = torch.randint(5, 100, (2, 8), generator=torch.Generator().manual_seed(3))
        mask = torch.ones_like(ids)
        ids[1, :3], mask[1, :3] = 0, 0  # ragged: the second row is 5 tokens, left-padded
        with CompileCounter() as counter:
            out = guard.generate(bloom, input_ids=ids, attention_mask=mask, max_new_tokens=4)
    assert counter.graphs == 0 and out.shape == (2, 12)
    torch._dynamo.reset()  # the next test starts with Dynamo as a fresh process has it
