"""Warmup and verify decode to a full cache: a decode that recompiles at a later step fails its shape.

The model here is a custom architecture, registered with transformers' Auto
classes the way a user's own code registers one, whose forward keeps a Python
int that changes at every call, as transformers' ``StaticSlidingWindowLayer``
does with ``cumulative_length_int``. Dynamo specialises on it, so every decode
step compiles again. Nothing is mocked: the real ``torch.compile`` decides.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_cli_query import _compile_all  # the registry's real claim → mark_compiled path
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.registry import Registry
from warmcache.warmup.verify import Verdict

pytestmark = pytest.mark.slow

#: Imported at start-up by every Python process that has the plugin folder on PYTHONPATH.
PLUGIN = """
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


class StepCountingConfig(LlamaConfig):
    model_type = "step-counting-llama"


class StepCountingLlama(LlamaForCausalLM):
    config_class = StepCountingConfig

    def forward(self, *args, **kwargs):
        # A Python int that changes every call: each decode step is a new graph.
        self.calls = getattr(self, "calls", 0) + 1
        output = super().forward(*args, **kwargs)
        output.logits = output.logits + 0.0 * self.calls
        return output


AutoConfig.register("step-counting-llama", StepCountingConfig)
AutoModelForCausalLM.register(StepCountingConfig, StepCountingLlama)
"""

MANIFEST = manifest_toml(
    model("counting", "{path}", backend="eager", generate=[generate(prompt_lengths=[4], max_cache_len=12)])
)


@pytest.fixture(scope="module")
def recompiling_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(plugin folder, checkpoint folder)`` of a tiny model whose decode compiles at every step."""
    import importlib.util

    root = tmp_path_factory.mktemp("step-counting")
    plugins = root / "plugins"
    plugins.mkdir()
    (plugins / "step_counting_llama.py").write_text(PLUGIN)
    (plugins / "sitecustomize.py").write_text("import step_counting_llama  # noqa: F401\n")
    spec = importlib.util.spec_from_file_location("step_counting_llama", plugins / "step_counting_llama.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from warmcache.examples.tiny_model import build_config

    llama = build_config("llama").to_dict()
    for key in ("model_type", "architectures", "transformers_version"):
        llama.pop(key, None)
    model = module.StepCountingLlama(module.StepCountingConfig(**llama))
    model.generation_config.pad_token_id = 0
    checkpoint = root / "counting"
    model.save_pretrained(checkpoint)
    return plugins, checkpoint


def cli(plugins: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "warmcache", *args, "--json"], capture_output=True, text=True, timeout=600, env=env
    )
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


def test_warmup_fails_a_shape_whose_decode_recompiles_after_the_first_steps(
    recompiling_model: tuple[Path, Path], tmp_path: Path
) -> None:
    plugins, checkpoint = recompiling_model
    manifest = tmp_path / "m.toml"
    manifest.write_text(MANIFEST.replace("{path}", str(checkpoint)))
    db = f"sqlite:///{tmp_path / 'r.sqlite'}"

    code, report, err = cli(plugins, "warmup", str(manifest), "--db", db, "--cache-dir", str(tmp_path / "cache"))

    assert code == 1, err
    (spec,) = report["specs"]
    assert spec["status"] == "failed"
    assert "decode compiled again" in spec["error"] and "calls" in spec["error"], spec["error"]  # names the guard
    with Registry.open(db) as registry:
        (row,) = registry.rows()
    assert row.status == "failed"


def test_verify_fails_a_compiled_shape_whose_decode_recompiles_after_the_first_steps(
    recompiling_model: tuple[Path, Path], tmp_path: Path
) -> None:
    # The row says compiled (as after a warmup on an older transformers or model code);
    # the replay in a fresh process decodes to a full cache and meets the per-step compile.
    plugins, checkpoint = recompiling_model
    manifest = tmp_path / "m.toml"
    manifest.write_text(MANIFEST.replace("{path}", str(checkpoint)))
    db = f"sqlite:///{tmp_path / 'r.sqlite'}"
    _compile_all(db, manifest)

    code, result, err = cli(plugins, "verify", str(manifest), "--db", db, "--cache-dir", str(tmp_path / "cache"))

    assert code == 1, err
    (verdict,) = result["specs"]
    assert verdict["verdict"] == Verdict.RECOMPILED
    assert "decode compiled again" in verdict["reason"] and "calls" in verdict["reason"], verdict["reason"]
    with Registry.open(db) as registry:
        (row,) = registry.rows()
    assert row.status == "failed" and row.error and row.error.startswith("verify: ")
