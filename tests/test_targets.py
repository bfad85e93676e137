"""Compile targets: cache-folder precedence, Neuron cache flags, and a clear error where a target cannot run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.cli import main
from warmcache.errors import UsageError
from warmcache.manifest import load_manifest
from warmcache.targets import (
    DEVICE_ALIASES,
    TARGET_CLASSES,
    InductorTarget,
    NeuronTarget,
    PrecompileRoute,
    resolve_cache_dir,
    target_for,
)
from warmcache.targets.inductor import inductor_default_cache_dir
from warmcache.warmup.summary import Shard

MODEL = model("m", backend="aot_eager", generate=[generate()])
MANIFEST = manifest_toml(MODEL, cache={"dir": "from-manifest"})


def test_cache_dir_precedence(write_manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = load_manifest(write_manifest(MANIFEST))
    target = target_for(manifest.models[0])
    assert isinstance(target, InductorTarget) and target.cache_flavor is None  # aot_eager keeps no cache

    # The folder the edge resolved (--cache-dir, then $WARMCACHE_CACHE_DIR: tests/test_settings.py), then the
    # manifest's.
    from_flag = resolve_cache_dir(target, tmp_path / "from-flag", manifest.cache_dir)
    assert from_flag == ((tmp_path / "from-flag").resolve(), True)
    assert resolve_cache_dir(target, None, manifest.cache_dir) == ((tmp_path / "from-manifest").resolve(), True)

    bare = load_manifest(write_manifest(manifest_toml(MODEL), name="bare.toml"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-env"))
    assert resolve_cache_dir(target, None, bare.cache_dir) == (tmp_path / "inductor-env", False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert resolve_cache_dir(target, None, bare.cache_dir) == (inductor_default_cache_dir(), False)


def test_inductor_target_points_torch_at_the_chosen_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    InductorTarget("cpu", "inductor").point_cache_at(tmp_path)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(tmp_path)


def test_neuron_cache_dir_from_flags_then_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = NeuronTarget("neuron", "neuron")
    for name in ("NEURON_CC_FLAGS", "NEURON_COMPILE_CACHE_URL", "TORCH_NEURONX_NEFF_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert target.default_cache_dir() == Path("/var/tmp/neuron-compile-cache") and target.cache_flavor == "neuron"
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", str(tmp_path / "url"))
    assert target.default_cache_dir() == tmp_path / "url"
    monkeypatch.setenv("NEURON_CC_FLAGS", f"--model-type transformer --cache_dir {tmp_path / 'flag'} -O1")
    assert target.default_cache_dir() == tmp_path / "flag"

    target.point_cache_at(tmp_path / "chosen")
    import os

    assert os.environ["NEURON_CC_FLAGS"] == f"--model-type transformer -O1 --cache_dir={tmp_path / 'chosen'}"
    assert os.environ["NEURON_COMPILE_CACHE_URL"] == str(tmp_path / "chosen")

    monkeypatch.setenv("NEURON_CC_FLAGS", "--cache_dir=s3://bucket/cache")
    with pytest.raises(UsageError, match="s3://bucket/cache"):
        target.default_cache_dir()


@pytest.mark.skipif(importlib.util.find_spec("torch_neuronx") is not None, reason="torch_neuronx is installed here")
def test_neuron_unavailable_is_a_clear_error_with_exit_4(write_manifest, tmp_path: Path) -> None:
    path = write_manifest(manifest_toml(model("m", device="neuron", generate=[generate()])))
    db = f"sqlite:///{tmp_path / 'r.sqlite'}"
    result = CliRunner().invoke(main, ["warmup", str(path), "--db", db])
    assert result.exit_code == 4, result.output
    assert "device 'neuron': torch_neuronx cannot be imported" in result.output
    # Nothing was claimed: the spec is still pending, not failed or stuck compiling.
    plan = CliRunner().invoke(main, ["plan", str(path), "--db", db, "--json"])
    assert [row["status"] for row in json.loads(plan.output)] == ["missing"]


def test_shards_are_disjoint_and_cover_the_plan(write_manifest) -> None:
    from warmcache.identity.plan import plan_manifest

    parsed = load_manifest(
        write_manifest(manifest_toml(model("m", backend="aot_eager", generate=[generate(batch_sizes=range(1, 8))])))
    )
    planned = plan_manifest(parsed)
    shards = [Shard.parse(f"{i}/3").select(planned) for i in (1, 2, 3)]
    ids = [p.identity for shard in shards for p in shard]
    assert sorted(ids) == sorted(p.identity for p in planned) and len(set(ids)) == len(ids)
    assert [len(s) for s in shards] == [3, 2, 2]
    for bad in ("0/3", "4/3", "1-3", "a/b"):
        with pytest.raises(UsageError, match="--shard"):
            Shard.parse(bad)


def test_aten_cpu_capability_is_part_of_an_inductor_cpu_toolchain(monkeypatch: pytest.MonkeyPatch) -> None:
    """It picks the vector ISA Inductor generates code for (``default``: none), so a row compiled under another value
    is stale, never served; the eager backends compile no code and ignore it."""
    from warmcache.identity.fingerprint import current_toolchain

    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    unset = current_toolchain("cpu", "inductor").platform
    platforms = {unset}
    for capability in ("default", "avx2", "avx512"):
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
        platforms.add(current_toolchain("cpu", "inductor").platform)
        assert current_toolchain("cpu", "aot_eager").platform == unset
    assert len(platforms) == 4, platforms


def test_each_target_names_its_own_toolchain_factors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fingerprint combines what a target names (vLLM's ``compute_hash`` per backend); it never branches on the
    device itself."""
    from warmcache.identity import fingerprint
    from warmcache.identity.fingerprint import current_toolchain
    from warmcache.targets.inductor import CUDA_PACKAGES

    monkeypatch.setenv("NEURON_CC_FLAGS", "-O1 --cache_dir /var/cache --model-type transformer")
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    neuron = NeuronTarget("neuron", "neuron").toolchain_factors()
    assert (neuron.platform, neuron.neuron_cc_flags, neuron.packages, neuron.cuda_driver) == (
        "neuron:trn2",
        "--model-type=transformer -O1",
        (),
        None,
    )
    cpu = InductorTarget("cpu", "inductor").toolchain_factors()
    assert cpu.platform.startswith("cpu:") and (cpu.neuron_cc_flags, cpu.packages, cpu.cuda_driver) == ("", (), None)
    cuda = InductorTarget("cuda", "inductor").toolchain_factors()
    assert cuda.platform.startswith("cuda:") and cuda.packages == CUDA_PACKAGES and cuda.cuda_driver is not None
    for device, backend, factors in (
        ("neuron", "neuron", neuron),
        ("cpu", "inductor", cpu),
        ("cuda", "inductor", cuda),
    ):
        toolchain = current_toolchain(device, backend)
        assert (toolchain.platform, toolchain.neuron_cc_flags, toolchain.cuda_driver) == (
            factors.platform,
            factors.neuron_cc_flags,
            factors.cuda_driver,
        )
        assert tuple(name for name, _ in toolchain.packages) == (*fingerprint._TOOLCHAIN_PACKAGES, *factors.packages)
    assert (
        '"neuron"' not in Path(fingerprint.__file__).read_text()
        and '"cuda"' not in Path(fingerprint.__file__).read_text()
    )


def test_the_precompile_route_is_one_value_that_knows_what_it_applies_to() -> None:
    """``precompile`` parses to one route; only generate specs save artifacts, and only AOTInductor decodes eagerly."""
    assert [PrecompileRoute.from_toml(v) for v in (False, True, "aotinductor", "aotinductr", 1)] == [
        PrecompileRoute.NONE,
        PrecompileRoute.AOT_COMPILE,
        PrecompileRoute.AOTINDUCTOR,
        None,
        None,
    ]
    assert PrecompileRoute.AOT_COMPILE.applies_to("generate") and not PrecompileRoute.AOT_COMPILE.applies_to("train")
    assert not PrecompileRoute.NONE.applies_to("generate")
    assert PrecompileRoute.AOTINDUCTOR.decodes_eagerly("generate")
    assert not PrecompileRoute.AOT_COMPILE.decodes_eagerly("generate")


def test_device_support_is_the_targets_answer() -> None:
    """The manifest's devices, aliases and precompile refusals all come from the target classes."""
    assert TARGET_CLASSES["neuron"] is NeuronTarget and TARGET_CLASSES["cuda"] is InductorTarget
    assert DEVICE_ALIASES["gpu"] == "cuda" and DEVICE_ALIASES["trn2"] == "neuron"
    assert NeuronTarget.precompile_problem(PrecompileRoute.AOT_COMPILE, "neuron", "neuron", "default")
    assert NeuronTarget.precompile_problem(PrecompileRoute.NONE, "neuron", "neuron", "default") is None
    assert InductorTarget.precompile_problem(PrecompileRoute.AOT_COMPILE, "cpu", "aot_eager", "default") is None
    assert InductorTarget.precompile_problem(PrecompileRoute.AOTINDUCTOR, "cpu", "aot_eager", "default")
