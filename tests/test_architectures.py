"""The architecture matrix: popular decoder families through warmup, verify, the guard and training.

Sliding-window (Mistral with a window) and hybrid (Gemma-2/3, Cohere-2) families
included: with transformers' own static cache they compile a decode graph at
every position; with warmcache's they must compile one per bucket, and decode
past the window with the greedy tokens of transformers' eager ``generate()``.
Families with recurrent state (LFM2's conv layers, the Mamba-2 layers of Granite-4.0-H,
Falcon-H1 and Bamba, Qwen3-Next's gated-delta layers) too, left-padded rows included: each
row must get the tokens its unpadded run gets. Their package routes are in
``tests/test_recurrent_state.py``.

One module-scoped warmup and verify serve every case (``warmcache_testkit.support_matrix``
runs the same functions to print the support table of docs/measurements/architectures.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from warmcache_testkit.manifests import generate, manifest_toml, model
from warmcache_testkit.support_matrix import ARCHITECTURES, MAX_CACHE_LEN, PROMPT_LENGTHS, Prepared, prepare, serve

from warmcache.cli import main
from warmcache.examples.tiny_model import SLIDING_WINDOW
from warmcache.registry import Registry


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    return prepare(tmp_path_factory.mktemp("matrix"), ARCHITECTURES)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_generate_warms_verifies_and_serves_past_the_window(prepared: Prepared, arch: str) -> None:
    assert prepared.generate[arch] == []
    assert prepared.verified[arch] == ["replay-only"] * len(PROMPT_LENGTHS)  # aot_eager: replayed, nothing on disk
    served = serve(prepared, arch)
    assert served.primed_graphs >= 1  # the guard really loaded a compiled decode step
    assert served.graphs_after_priming == 0
    assert served.mismatches == []
    # decodes ran past the window
    assert served.tokens_compared > 0 and MAX_CACHE_LEN - max(PROMPT_LENGTHS) > SLIDING_WINDOW


#: Training steps torch's aot_eager backend cannot run: it replays the backward graph eagerly, and Qwen3-Next's
#: ``in_proj_ba`` backward views a gradient whose strides differ from the traced ones (pytorch/pytorch#120035,
#: open). Inductor trains it (``python -m warmcache_testkit.support_matrix --arch qwen3-next --backend inductor``).
AOT_EAGER_CANNOT_TRAIN = {"qwen3-next": "torch's aot_eager backward: view of a non-contiguous gradient (#120035)"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch",
    [
        pytest.param(arch, marks=pytest.mark.xfail(strict=True, reason=AOT_EAGER_CANNOT_TRAIN[arch]))
        if arch in AOT_EAGER_CANNOT_TRAIN
        else arch
        for arch in ARCHITECTURES
    ],
)
def test_training_warms(prepared: Prepared, arch: str) -> None:
    assert prepared.train[arch] == []


def test_plan_refuses_an_architecture_the_static_cache_cannot_hold(tmp_path: Path) -> None:
    from transformers import Llama4TextConfig

    # Only config.json is read at plan time: no weights needed. Llama 4's chunked attention keeps
    # keys per chunk, which no layer of warmcache's static cache holds.
    Llama4TextConfig(num_hidden_layers=2).save_pretrained(tmp_path / "next")
    manifest = tmp_path / "m.toml"
    manifest.write_text(manifest_toml(model("next", str(tmp_path / "next"), generate=[generate(max_cache_len=32)])))
    Registry.open(f"sqlite:///{tmp_path / 'r.sqlite'}").close()  # plan reads a registry, it never creates one
    for command in ("plan", "warmup"):
        result = CliRunner().invoke(
            main, [command, str(manifest), "--db", f"sqlite:///{tmp_path / 'r.sqlite'}", "--json"]
        )
        assert result.exit_code == 2, result.output
        assert "model 'next'" in result.output and "chunked_attention" in result.output, result.output


def test_plan_accepts_every_matrix_architecture(prepared_configs: Path) -> None:
    Registry.open(f"sqlite:///{prepared_configs.parent / 'r.sqlite'}").close()
    result = CliRunner().invoke(
        main, ["plan", str(prepared_configs), "--db", f"sqlite:///{prepared_configs.parent / 'r.sqlite'}", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert {item["model"] for item in json.loads(result.output)} == set(ARCHITECTURES)


@pytest.fixture
def prepared_configs(tmp_path: Path) -> Path:
    """A manifest over every matrix architecture's config (no weights: plan reads configs only)."""
    from warmcache.examples.tiny_model import build_config

    tables = []
    for arch in ARCHITECTURES:
        build_config(arch).save_pretrained(tmp_path / arch)
        tables.append(model(arch, str(tmp_path / arch), generate=[generate(max_cache_len=32)]))
    manifest = tmp_path / "m.toml"
    manifest.write_text(manifest_toml(*tables))
    return manifest
