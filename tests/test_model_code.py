"""Plan refuses, before anything compiles, a family whose own code decides its decode graph at every step.

The family sweep found four that compiled at warmup and then failed there with an
``IndexError`` or a new graph per step (docs/measurements/architectures.md); each is
now asked of its config and code by :mod:`warmcache.identity.model_code` when the
manifest is planned. Only config.json is written: plan reads no weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from transformers import GenerationConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from warmcache_testkit.family_sweep import tiny_config
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.cli import main
from warmcache.identity.model_code import code_problems
from warmcache.registry import Registry

#: Each family, with the tiny config the sweep built, and the words its refusal must name.
REFUSED = {
    "jetmoe": ({}, "JetMoeTopKGating (.tolist()) reads tensor values as Python numbers"),
    "mpt": (
        {},
        "use_cache is false in its generation config (the model config's default when there is no "
        "generation_config.json), so generate() feeds the whole sequence at every step",
    ),
    "dory": ({}, "DoryModel.forward adds layers to the cache object it is given"),
    "blt": ({}, "BltModel.forward wraps the cache it is given in a cache object of its own"),
    "gpt_neo": ({}, "its 'local' attention layers (GPT-Neo's) place their 8-token window by the number of keys"),
    "qwen4_exp_text": (
        {"layer_types": ["linear_attention", "linear_attention"]},
        "no layer keeps attention (layer kinds: linear_attention)",
    ),
}


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_plan_refuses_a_family_whose_code_decides_the_graph_at_every_step(tmp_path: Path, family: str) -> None:
    overrides, reason = REFUSED[family]
    config = tiny_config(family)
    for key, value in overrides.items():
        setattr(config, key, value)
    config.save_pretrained(tmp_path / family)
    manifest = tmp_path / "m.toml"
    manifest.write_text(manifest_toml(model(family, str(tmp_path / family), generate=[generate(max_cache_len=32)])))
    Registry.open(f"sqlite:///{tmp_path / 'r.sqlite'}").close()  # plan reads a registry, it never creates one
    result = CliRunner().invoke(main, ["plan", str(manifest), "--db", f"sqlite:///{tmp_path / 'r.sqlite'}"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if f"model {family!r}" in line]
    assert len(lines) == 1 and reason in lines[0], result.output


def test_use_cache_in_generation_config_json_is_what_plan_reads(tmp_path: Path) -> None:
    """MPT's config turns the cache off; a generation_config.json that turns it on is what generate() uses."""
    config = tiny_config("mpt")
    config.save_pretrained(tmp_path / "mpt")
    GenerationConfig(use_cache=True).save_pretrained(tmp_path / "mpt")
    manifest = tmp_path / "m.toml"
    manifest.write_text(manifest_toml(model("mpt", str(tmp_path / "mpt"), generate=[generate(max_cache_len=32)])))
    Registry.open(f"sqlite:///{tmp_path / 'r.sqlite'}").close()
    result = CliRunner().invoke(main, ["plan", str(manifest), "--db", f"sqlite:///{tmp_path / 'r.sqlite'}"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("family", ["nemotron_h", "granitemoe", "doge", "falcon_h1", "gpt2"])
def test_code_that_reads_values_only_outside_the_decode_path_is_not_refused(family: str) -> None:
    """Nemotron-H's experts loop reads ``.item()`` but transformers dispatches its forward to an experts kernel;
    Granite-MoE names ``.tolist()`` only in a docstring; Doge and Falcon-H1 tell transformers they cannot compile
    fullgraph with its own cache (``_can_compile_fullgraph = False``) and pass on warmcache's; GPT-2 wraps its cache
    as BLT does only under ``add_cross_attention``, off in a decoder's config. All pass the sweep."""
    config = tiny_config(family)
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    assert code_problems(config, model_class, GenerationConfig.from_model_config(config), max_cache_len=32) == []


def test_gpt_neo_is_served_while_its_static_cache_fits_inside_the_window(tmp_path: Path) -> None:
    """GPT-Neo's window follows the cache's length: a cache no longer than the window never masks, as the model's own
    window would not inside it (published GPT-Neo: window 256), so such a bucket is accepted."""
    config = tiny_config("gpt_neo")
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    generation = GenerationConfig.from_model_config(config)
    assert code_problems(config, model_class, generation, max_cache_len=config.window_size) == []
    assert code_problems(config, model_class, generation, max_cache_len=config.window_size + 1) != []


def test_gpt_neo_static_caches_leave_the_model_past_its_window_and_agree_inside_it() -> None:
    """The refusal's premise, measured (``warmcache_testkit.cache_agreement``, float64): past GPT-Neo's window both
    static caches, transformers' own too, part from a cache-free forward pass; with the window as long as the cache, all
    agree."""
    from warmcache_testkit.cache_agreement import agreement

    past = agreement("gpt_neo", {}, new_tokens=8, max_cache_len=16)
    inside = agreement("gpt_neo", {"window_size": 16}, new_tokens=8, max_cache_len=16)
    assert past["dynamic, mask ones"] < 1e-3 and past["warmcache, mask ones"] > 0.1, past
    assert past["transformers static, mask none"] > 0.1, past
    assert max(inside.values()) < 1e-3, inside
