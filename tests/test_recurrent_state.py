"""Families with recurrent state through the package routes: LFM2 (conv), Granite-4.0-H (Mamba-2 beside attention),
Falcon-H1 (both in one layer).

Their conv windows and SSM states are fixed-size tensors the decode step writes in place; an
AOTInductor package takes them as plain inputs beside keys and values and must write them back
into the caller's tensors. One warmup and verify (``precompile = "aotinductor"``, Inductor; and
Falcon-H1 once more with ``precompile = true`` on aot_eager) serves every test here. The
Inductor route of these families, training included, is ``tests/test_architectures.py``'s
(``warmcache_testkit.support_matrix``). Left padding must give every row the tokens of its unpadded run,
and a model whose state would keep the pad tokens is refused padding instead
(:mod:`warmcache.modeling.padding_probe`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from warmcache_testkit.inductor_host import warmcache_json
from warmcache_testkit.manifests import generate, manifest_toml, model
from warmcache_testkit.serving_check import assert_served_by_packages, serve

from warmcache.artifacts.kinds import precompiled_entries
from warmcache.errors import UsageError
from warmcache.examples.tiny_model import build_config, build_tiny_model
from warmcache.registry import Registry

PACKAGED = ("lfm2", "granitemoehybrid", "falcon-h1")
#: Falcon-H1 again through ``precompile = true``: its layers hold keys, values, a conv window and an SSM state at once.
PRECOMPILED = "falcon-h1-precompiled"
BATCH, PROMPT, MAX_CACHE_LEN = 2, 8, 24
#: Ragged requests (each row's prompt length): a single row padded onto the batch-2 bucket, and left-padded pairs.
REQUESTS = ((5,), (8, 3), (2, 7))


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real ``warmcache warmup`` and ``warmcache verify`` of every family here, in one manifest."""
    root = tmp_path_factory.mktemp("recurrent")
    paths = {arch: build_tiny_model(arch, root / "models" / arch) for arch in PACKAGED}
    shapes = [generate((BATCH,), (PROMPT,), MAX_CACHE_LEN)]
    declared = [
        model(arch, str(path), backend="inductor", precompile="aotinductor", generate=shapes)
        for arch, path in paths.items()
    ]
    declared.append(model(PRECOMPILED, str(paths["falcon-h1"]), backend="aot_eager", precompile=True, generate=shapes))
    manifest = root / "manifest.toml"
    manifest.write_text(
        manifest_toml(*declared, registry={"url": f"sqlite:///{root}/registry.sqlite"}, cache={"dir": f"{root}/cache"})
    )
    for command in ("warmup", "verify"):
        warmcache_json(command, str(manifest))
    return root


def _row(root: Path, name: str) -> Any:
    with Registry.open(f"sqlite:///{root}/registry.sqlite") as registry:
        (row,) = registry.rows(model=name, with_artifacts=True)
    return row


def _model(root: Path, arch: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(root / "models" / arch, dtype=torch.float32).eval()


@pytest.mark.slow
def test_every_family_is_verified_with_its_package(warmed: Path) -> None:
    for name in (*PACKAGED, PRECOMPILED):
        row = _row(warmed, name)
        # aot_eager keeps no persistent cache: its row stays compiled, its artifact proven by the same replay
        assert row.status == ("verified" if name != PRECOMPILED else "compiled"), (name, row.error)
        assert row.error is None and len(precompiled_entries(row)) == 1, (name, row.artifacts)


@pytest.mark.slow
@pytest.mark.parametrize("arch", PACKAGED)
def test_fresh_process_serves_ragged_requests_from_packages_without_the_compiler(warmed: Path, arch: str) -> None:
    served = serve(warmed, warmed / "models" / arch, REQUESTS, prompt=PROMPT, max_cache_len=MAX_CACHE_LEN, name=arch)
    assert_served_by_packages(served, packages=1, min_calls=len(REQUESTS) * (MAX_CACHE_LEN - PROMPT))


@pytest.mark.slow
def test_fresh_process_serves_from_the_precompiled_artifact_without_tracing(warmed: Path) -> None:
    served = serve(
        warmed, warmed / "models" / "falcon-h1", REQUESTS, prompt=PROMPT, max_cache_len=MAX_CACHE_LEN, name=PRECOMPILED
    )
    assert served["artifacts_loaded"] == 1 and served["graphs"] == 0 and served["frames"] == 0, served
    assert served["package_calls"] >= len(REQUESTS) * (MAX_CACHE_LEN - PROMPT)
    assert all(r["agrees"] for r in served["results"]), [r["agreement"] for r in served["results"]]


@pytest.mark.slow
@pytest.mark.parametrize("arch", PACKAGED)
def test_left_padded_rows_get_the_tokens_of_their_unpadded_runs(warmed: Path, arch: str) -> None:
    import torch

    from warmcache.runtime.guard import ShapeGuard

    loaded = _model(warmed, arch)
    with ShapeGuard.from_registry(f"sqlite:///{warmed}/registry.sqlite", arch, telemetry=False) as guard:
        guard.prime(loaded)
        ids = torch.randint(5, 300, (BATCH, PROMPT), generator=torch.Generator().manual_seed(3))
        mask = torch.ones_like(ids)
        ids[1, :5], mask[1, :5] = 0, 0  # row 1 holds 3 tokens, left-padded to the bucket
        new = MAX_CACHE_LEN - PROMPT + 1
        served = guard.generate(loaded, input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new)
    for row, length in enumerate((PROMPT, 3)):
        alone = loaded.generate(
            input_ids=ids[row : row + 1, PROMPT - length :],
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
            disable_compile=True,
        )
        assert served[row, PROMPT:].tolist() == alone[0, length:].tolist(), row


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "lost"), [("lfm2", "conv_states"), ("falcon-h1", "recurrent_states")])
def test_verify_fails_a_package_whose_state_writes_are_lost(
    warmed: Path, arch: str, lost: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package writes a decode step's conv window and SSM state into the caller's tensors; if those writes never
    reach the cache (a copy handed to the package), every later step reads a stale state, and verify must say so."""
    import warmcache.artifacts.aoti_loader as runtime
    from warmcache.identity.plan import plan_manifest
    from warmcache.manifest import load_manifest
    from warmcache.modeling.generation import compile_config
    from warmcache.warmup.verify.artifact_proof import prove_artifacts

    (planned,) = plan_manifest(load_manifest(warmed / "manifest.toml"), arch)
    row = _row(warmed, arch)
    loaded = _model(warmed, arch)
    config = compile_config("inductor", "default", "cpu")
    assert prove_artifacts(loaded, row, planned.spec, config, Path(row.cache_root)) is None
    flatten = runtime.flatten

    def flatten_with_copies(kwargs: dict[str, Any]) -> tuple[list[str], list[Any]]:
        names, tensors = flatten(kwargs)
        return names, [t.clone() if f".{lost}[" in name else t for name, t in zip(names, tensors)]

    monkeypatch.setattr(runtime, "flatten", flatten_with_copies)
    failed = prove_artifacts(loaded, row, planned.spec, config, Path(row.cache_root))
    assert failed is not None and "precompiled artifact differs from" in failed, failed


def test_padding_is_refused_for_a_model_whose_state_would_keep_the_pad_tokens(tmp_path: Path) -> None:
    """LFM2 with ``conv_bias`` projects a zeroed pad token onto its bias, which its conv window keeps: its left-padded
    rows would differ from their unpadded runs, so the guard refuses to pad for it, and serves what needs no padding."""
    import torch
    from test_cli_query import _compile_all
    from transformers import AutoModelForCausalLM

    from warmcache.modeling.padding_probe import padding_leak
    from warmcache.runtime.guard import ShapeGuard

    torch.manual_seed(0)
    clean = AutoModelForCausalLM.from_config(build_config("lfm2")).eval()
    config = build_config("lfm2")
    config.conv_bias = True
    biased = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, parameter in biased.named_parameters():
            if name.endswith("in_proj.bias"):
                parameter.normal_()  # a trained bias is not zero (transformers initialises it to zero)
    assert padding_leak(clean) is None
    assert "layer 0 of Lfm2ForCausalLM keeps pad tokens in its conv state" in str(padding_leak(biased))

    config.save_pretrained(tmp_path / "biased")  # plan and the registry read only config.json
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        manifest_toml(model("m", str(tmp_path / "biased"), backend="aot_eager", generate=[generate((2,), (4,), 8)]))
    )
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    _compile_all(url, manifest)
    with ShapeGuard.from_registry(url, "m", telemetry=False) as guard:
        ids = torch.randint(5, 300, (2, 4))
        refused = r"left-padded.*keeps pad tokens.*send rows of exactly one compiled prompt length \(4\)"
        with pytest.raises(UsageError, match=refused):
            guard.generate(biased, input_ids=ids[:, 1:], max_new_tokens=2)  # padded onto seq=4
        with pytest.raises(UsageError, match="keeps pad tokens"):
            guard.generate(biased, input_ids=ids, attention_mask=torch.tensor([[1] * 4, [0, 1, 1, 1]]))
        assert guard.generate(biased, input_ids=ids, max_new_tokens=2).shape == (2, 6)  # exactly a bucket: served


def test_a_recurrent_cache_is_taken_apart_into_its_states_and_held_around_them_again() -> None:
    """What a package's inputs are (``flatten``), what dispatch keys on (``decode_signature``) and what the exported
    step rebuilds (``hold``) all name each layer's conv window and SSM state: drop one and the package would take, or
    dispatch on, a cache without it."""
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.artifacts.format import decode_signature
    from warmcache.modeling.decode_inputs import flatten
    from warmcache.modeling.kv_cache import PositionTensorCache, hold

    loaded = AutoModelForCausalLM.from_config(build_config("falcon-h1")).eval()  # hybrid: keys, values and state
    cache = PositionTensorCache(loaded.config, MAX_CACHE_LEN)
    with torch.no_grad():
        loaded(input_ids=torch.randint(5, 300, (BATCH, PROMPT)), cache=cache)  # the prefill allocates every state
    names, tensors = flatten({"input_ids": torch.zeros(BATCH, 1, dtype=torch.long), "cache": cache})
    layer = [name.removeprefix("cache.layers[0].") for name in names if name.startswith("cache.layers[0].")]
    assert layer == ["keys", "values", "cumulative_length", "conv_states[0]", "recurrent_states[0]"]
    signed = [entry[0] for entry in decode_signature({"cache": cache})]
    assert "cache.layers[1].conv_states[0]" in signed and "cache.layers[1].recurrent_states[0]" in signed

    rebuilt = PositionTensorCache(loaded.config, MAX_CACHE_LEN)
    given = dict(zip(names, tensors))
    for index, held in enumerate(rebuilt.layers):
        prefix = f"cache.layers[{index}]."
        hold(held, {name.removeprefix(prefix): t for name, t in given.items() if name.startswith(prefix)})
        assert rebuilt.get_conv_state(index) is cache.layers[index].conv_states[0]
        assert rebuilt.get_recurrent_state(index) is cache.layers[index].recurrent_states[0]
        assert held.keys is cache.layers[index].keys and rebuilt.has_previous_state(index)


@pytest.mark.slow
def test_a_model_that_keeps_its_state_on_its_modules_gets_no_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RecurrentGemma keeps its conv and recurrent state as plain attributes of its modules, outside the Cache object:
    export carries them into a package at their value at warmup, which would then serve every request with warmup's
    state. Warmup refuses the spec before the compile; a package built without that check (an earlier warmcache) is
    disproven by verify, naming the moved tensor, where it used to blame a code change."""
    import subprocess
    import sys

    from click.testing import CliRunner
    from warmcache_testkit.family_sweep import build_family_model

    from warmcache.artifacts import aoti_export
    from warmcache.cli import main

    path = build_family_model("recurrent_gemma", tmp_path / "rg")
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        manifest_toml(
            model("rg", str(path), backend="inductor", precompile="aotinductor", generate=[generate((2,), (8,), 24)]),
            registry={"url": f"sqlite:///{tmp_path / 'r.sqlite'}"},
            cache={"dir": str(tmp_path / "cache")},
        )
    )

    def run(command: str, *extra: str) -> tuple[int, str]:
        done = subprocess.run(
            [sys.executable, "-m", "warmcache", command, str(manifest), *extra],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.returncode, done.stdout + done.stderr

    code, said = run("warmup")
    assert code != 0 and "the decode step reads model.model.layers.0.temporal_block.conv1d_state (and 1 more)" in said
    assert "precompile = false" in said, said
    monkeypatch.setattr(aoti_export, "refuse_carried_state", lambda *args: None)  # as an earlier warmcache packaged it
    built = CliRunner().invoke(main, ["warmup", str(manifest), "--retry-failed"])
    assert built.exit_code == 0, built.output
    code, said = run("verify")
    assert code == 1 and "carries model.model.layers.0.temporal_block.conv1d_state (and 1 more) at its value" in said
    assert "precompile = false" in said and "code changed" not in said, said
