"""Production proves what verify proved: a start refuses an artifact traced from other model code than it runs.

warmup records the digest of the model's code (:mod:`warmcache.identity.code_digest`) in each
precompiled artifact's header; ``prime`` recomputes it for the model it binds before loading
any (:mod:`warmcache.artifacts.code_check`). The refusal uses the suite's one AOTInductor
warmup (``packaged``) and never loads a package; the unchanged model then primes from them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from warmcache.errors import CacheError, ExitCode
from warmcache.identity.code_digest import model_code_digest


def _tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64
    )
    return LlamaForCausalLM(config)


def test_the_digest_follows_the_code_not_the_weights_and_sees_a_patched_method_or_helper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from transformers.models.llama import modeling_llama

    first, second = _tiny_llama(), _tiny_llama()  # other random weights, same code
    digest = model_code_digest(first)
    assert re.fullmatch(r"[0-9a-f]{64}", digest) and model_code_digest(second) == digest

    forward = modeling_llama.LlamaMLP.forward
    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", lambda self, x: forward(self, x) * 1.05)
    patched_method = model_code_digest(first)
    monkeypatch.undo()
    rotary = modeling_llama.apply_rotary_pos_emb
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", lambda *a, **k: rotary(*a, **k))
    patched_helper = model_code_digest(first)
    monkeypatch.undo()
    assert len({digest, patched_method, patched_helper}) == 3
    assert model_code_digest(first) == digest  # undone: the same code again


def _model(path: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.slow
def test_prime_refuses_packages_warmed_from_other_model_code_and_primes_the_same_code(
    packaged: Path, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image's MLP computes 5 % more than warmup's: same checkpoint, same config, so the rows match, but the
    packages would serve warmup's graph. Refused before any is loaded, one line naming the package; the warmup
    process's digest is this process's for the same code (this one has imported the compiler, which patches
    ``nn.Module``)."""
    from transformers.models.llama import modeling_llama

    from warmcache.runtime.guard import ShapeGuard

    registry = f"sqlite:///{packaged}/registry.sqlite"
    forward = modeling_llama.LlamaMLP.forward
    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", lambda self, x: forward(self, x) * 1.05)
    changed = _model(tiny_models["llama"])
    with pytest.raises(CacheError) as refused:
        ShapeGuard.from_registry(registry, "m", telemetry=False).prime(changed)
    said = str(refused.value)
    assert re.match(
        rf"{re.escape(str(packaged / 'cache'))}/aotinductor/[0-9a-f]{{64}}: precompiled artifact was built from other "
        r"model code than this process runs .* the model's code changed since warmup and verify",
        said,
    ), said
    assert "warmup --retry-failed" in said and "\n" not in said and refused.value.exit_code == ExitCode.CACHE
    assert "get_compiled_call" not in vars(changed)  # nothing was installed on the refused model

    monkeypatch.undo()
    report = ShapeGuard.from_registry(registry, "m", telemetry=False).prime(_model(tiny_models["llama"]))
    assert report.artifacts_loaded == 2 and report.graphs == 0 and not report.artifact_errors
