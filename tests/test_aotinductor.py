"""AOTInductor decode packages (tiny Llama, Inductor): a fresh process serves generate() with no compiler at all.

The packages are built once per session (each AOTInductor compile costs 20-40 s on
a 2-core machine) and shared by every test here; the refusal tests never load one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from manifests import generate, manifest_toml, model
from serving_check import assert_served_by_packages, serve

from warmcache.cache.layout import AOTINDUCTOR, entry_of
from warmcache.errors import CacheError, ManifestError, UsageError
from warmcache.registry import Registry

MAX_CACHE_LEN = 16
PROMPT = 8
BATCHES = (1, 4)
#: Ragged requests (each row's prompt length), served by the batch-1 and batch-4 packages.
REQUESTS = ((5,), (8, 3, 6), (2, 8, 7, 4), (8, 8, 8, 8))


def _warm(root: Path, model_path: Path, device: str) -> Path:
    """A registry and cache filled by the real ``warmcache warmup`` and ``warmcache verify`` with ``precompile = "aotinductor"``."""
    manifest = root / "manifest.toml"
    declared = model("m", str(model_path), device=device, backend="inductor", precompile="aotinductor", generate=[generate(BATCHES, [PROMPT], MAX_CACHE_LEN)])
    manifest.write_text(manifest_toml(declared, registry={"url": f"sqlite:///{root}/registry.sqlite"}, cache={"dir": f"{root}/cache"}))
    for command in ("warmup", "verify"):
        done = subprocess.run([sys.executable, "-m", "warmcache", command, str(manifest), "--json"], capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{command}: {done.stderr[-3000:]}"
    return root


@pytest.fixture(scope="session")
def packaged(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _warm(tmp_path_factory.mktemp("aotinductor"), tiny_models["llama"], "cpu")


def _serve(root: Path, model_path: Path, device: str = "cpu") -> dict[str, Any]:
    return serve(root, model_path, REQUESTS, prompt=PROMPT, max_cache_len=MAX_CACHE_LEN, device=device)


def _rows(root: Path) -> dict[int, Any]:
    with Registry.open(f"sqlite:///{root}/registry.sqlite") as registry:
        return {row.batch_size: row for row in registry.rows(model="m", with_artifacts=True)}


def _package(row: Any) -> str:
    (entry,) = [a.path for a in row.artifacts if a.kind == AOTINDUCTOR]
    return str(entry)


def _assert_served_by_packages(served: dict[str, Any]) -> None:
    assert_served_by_packages(served, packages=len(BATCHES), min_calls=len(REQUESTS) * (MAX_CACHE_LEN - PROMPT))


@pytest.mark.slow
def test_fresh_process_serves_ragged_requests_from_packages_without_the_compiler(packaged: Path, tiny_models: dict[str, Path]) -> None:
    _assert_served_by_packages(_serve(packaged, tiny_models["llama"]))


@pytest.mark.slow
def test_each_bucket_has_one_verified_package_without_weights(packaged: Path) -> None:
    rows = _rows(packaged)
    assert sorted(rows) == list(BATCHES) and all(row.status == "verified" for row in rows.values())
    entries = {batch: _package(row) for batch, row in rows.items()}
    assert len(set(entries.values())) == len(BATCHES) and all(entry_of("inductor", e) == (AOTINDUCTOR, e) for e in entries.values())
    data = (packaged / "cache" / entries[4]).read_bytes()
    header = json.loads(data.split(b"\n")[1])
    assert header["fingerprint"]["batch_size"] == 4 and header["aotinductor"]["cpu_capability"]
    assert ["input_ids", [4, 1], "torch.int64"] in header["aotinductor"]["inputs"]
    assert "model.lm_head.weight" in header["aotinductor"]["constants"]


@pytest.mark.slow
def test_tampered_package_is_refused_before_loading(packaged: Path, tiny_models: dict[str, Path], tmp_path: Path) -> None:
    from warmcache.runtime.aotinductor import load_package
    from warmcache.runtime.precompiled import expected_fingerprint

    row = _rows(packaged)[1]
    entry = _package(row)
    (tmp_path / entry).parent.mkdir(parents=True)
    data = bytearray((packaged / "cache" / entry).read_bytes())
    data[-100] ^= 0xFF
    (tmp_path / entry).write_bytes(bytes(data))
    with pytest.raises(CacheError, match=r"sha256 .* differs from its registry record") as refused:
        load_package(tmp_path, entry, expected_fingerprint(row), _model(tiny_models["llama"]))
    assert "\n" not in str(refused.value) and str(tmp_path / entry) in str(refused.value)


@pytest.mark.slow
def test_package_of_another_batch_size_is_refused_before_loading(packaged: Path, tiny_models: dict[str, Path]) -> None:
    from warmcache.runtime.aotinductor import load_package
    from warmcache.runtime.precompiled import expected_fingerprint

    rows = _rows(packaged)
    with pytest.raises(CacheError, match=r"compiled for another batch_size: batch_size=4 \(row: 1\)") as refused:
        load_package(packaged / "cache", _package(rows[4]), expected_fingerprint(rows[1]), _model(tiny_models["llama"]))
    assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_model_whose_config_differs_from_the_rows_is_refused_before_loading(packaged: Path, tiny_models: dict[str, Path]) -> None:
    from warmcache.runtime.guard import ShapeGuard

    guard = ShapeGuard.from_registry(f"sqlite:///{packaged}/registry.sqlite", "m", telemetry=False)
    with pytest.raises(UsageError, match="matches no compiled rows") as refused:
        guard.prime(_model(tiny_models["qwen3"]))
    assert "\n" not in str(refused.value)


def _model(path: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_package_built_for_a_wider_cpu_is_refused() -> None:
    from warmcache.runtime.aotinductor import cpu_can_run

    assert cpu_can_run("AVX2", "AVX512") and cpu_can_run("AVX512", "AVX512")
    assert not cpu_can_run("AVX512", "AVX2") and not cpu_can_run("SVE256", "AVX512")


@pytest.mark.parametrize(
    ("keys", "workload", "at"),
    [
        ({"device": "neuron", "backend": "neuron"}, {}, r"model\[0\]\.precompile.*Neuron"),
        ({"backend": "aot_eager"}, {}, r"model\[0\]\.precompile.*backend 'inductor'"),
        ({"distributed": {"tp_size": 2}}, {}, r"model\[0\]\.precompile.*sharded"),
        ({}, {"prefill_chunk_size": 4}, r"generate\[0\]\.prefill_chunk_size"),
        ({}, {"num_beams": 2}, r"generate\[0\]\.num_beams"),
        ({"precompile": "aotinductr"}, {}, r"model\[0\]\.precompile.*'aotinductor'"),
    ],
)
def test_manifest_refuses_what_a_package_cannot_serve(keys: dict[str, Any], workload: dict[str, Any], at: str, write_manifest) -> None:  # type: ignore[no-untyped-def]
    from warmcache.manifest import load_manifest

    declared = {"precompile": "aotinductor", "backend": "inductor", **keys}
    path = write_manifest(manifest_toml(model("m", **declared, generate=[generate(max_cache_len=32, **workload)])))
    with pytest.raises(ManifestError, match=at):
        load_manifest(path)


@pytest.mark.slow
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA device on this machine (CI has none); runs on a GPU host")
def test_cuda_serves_from_packages_without_the_compiler(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    root = _warm(tmp_path, tiny_models["llama"], "cuda")
    served = _serve(root, tiny_models["llama"], "cuda")
    print(json.dumps({k: v for k, v in served.items() if k != "results"}))  # the figures tools/cuda_aoti_check.sh collects
    _assert_served_by_packages(served)
    shutil.rmtree(root / "cache", ignore_errors=True)


@pytest.mark.slow
def test_packages_run_the_weights_of_the_model_that_loads_them(packaged: Path, tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """Another checkpoint of the same config shares the packages: its own weights are bound, its own tokens come out."""
    import torch
    from tiny_model import build_tiny_model

    from warmcache.runtime.guard import ShapeGuard

    other = _model(build_tiny_model("llama", tmp_path / "other", seed=1))
    guard = ShapeGuard.from_registry(f"sqlite:///{packaged}/registry.sqlite", "m", telemetry=False)
    assert guard.prime(other).artifacts_loaded == len(BATCHES)
    ids = torch.randint(5, 300, (1, PROMPT), generator=torch.Generator().manual_seed(7))
    out = guard.generate(other, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6)
    eager = other.generate(input_ids=ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, disable_compile=True, pad_token_id=0)
    original = _model(tiny_models["llama"]).generate(input_ids=ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, disable_compile=True, pad_token_id=0)
    assert out.tolist() == eager.tolist() != original.tolist()


@pytest.mark.slow
def test_bundle_and_cache_scan_carry_the_packages(packaged: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from warmcache.cli import main

    bundle, cache = tmp_path / "b.tar", tmp_path / "cache"
    where = ["--cache-dir", str(cache), "--db", f"sqlite:///{tmp_path / 'other.sqlite'}"]
    outputs = {}
    for name, command in {
        "pack": ["bundle", "pack", str(packaged / "manifest.toml"), "-o", str(bundle)],
        "unpack": ["bundle", "unpack", str(bundle), "--allow-unsigned", *where],
        "scan": ["cache", "scan", *where, "--json"],
        # The rows reference their packages: an orphan prune keeps them, the doctor finds nothing missing.
        "prune": ["cache", "prune", "--orphans", "--grace", "0s", "--dry-run", *where, "--json"],
        "doctor": ["cache", "doctor", *where, "--json"],
    }.items():
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 0, f"{name}: {result.output}"
        outputs[name] = result.output
    entries = [_package(row) for row in _rows(packaged).values()]
    assert all((cache / entry).read_bytes() == (packaged / "cache" / entry).read_bytes() for entry in entries)
    assert f'"{AOTINDUCTOR}"' in outputs["scan"]
    assert not any(entry in outputs["prune"] + outputs["doctor"] for entry in entries)


def test_dispatch_refuses_an_input_the_package_was_not_built_for() -> None:
    """The AOTInductor runner checks nothing itself: a non-contiguous cache would give wrong logits, silently."""
    import torch

    from warmcache.runtime.aotinductor import PackagedDecodeStep

    step = PackagedDecodeStep(loader=None, inputs=[("cache.layers[0].keys", (1, 2, 4, 8), "torch.float32")], fixed={}, device="cpu", where="pkg")
    step._check(["cache.layers[0].keys"], [torch.zeros(1, 2, 4, 8)], {})
    for bad in (torch.zeros(1, 2, 8, 4).transpose(2, 3), torch.zeros(2, 2, 4, 8), torch.zeros(1, 2, 4, 8, dtype=torch.float16)):
        with pytest.raises(UsageError, match="differs from the package's"):
            step._check(["cache.layers[0].keys"], [bad], {})
    with pytest.raises(UsageError, match="is not the one the package was built for"):
        step._check(["cache.layers[0].keys"], [torch.zeros(1, 2, 4, 8)], {"logits_to_keep": 2})
