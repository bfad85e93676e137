"""A compiled shape's identity: complete (compiler variables, attention), host-free, and every miss explained (no
compiles)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from warmcache_testkit.manifests import generate, manifest_toml, model, train
from warmcache_testkit.registry_fill import mark_all_compiled

from warmcache.cli import main
from warmcache.errors import UsageError
from warmcache.identity.compile_env import EXCLUDED_ENV, GRAPH_ENV, NEURON_GRAPH_ENV, TORCH_GRAPH_ENV, compile_env
from warmcache.identity.fingerprint import current_toolchain
from warmcache.identity.plan import PlannedShape, plan_manifest
from warmcache.manifest import load_manifest, loads
from warmcache.registry.differences import toolchain_differences
from warmcache.registry.registry import pending_row_values
from warmcache.registry.usability import local_toolchain_hash
from warmcache.runtime.guard import ShapeGuard
from warmcache.targets.inductor import nvidia_driver_version

#: The config modules whose variables decide what Inductor, Dynamo and AOTAutograd compile.
TORCH_CONFIG_MODULES = ("torch._inductor.config", "torch._dynamo.config", "torch._functorch.config")
TORCH_VARIABLE = re.compile(r"""["']((?:TORCHINDUCTOR|TORCHDYNAMO|TORCH_COMPILE)_[A-Z0-9_]+)["']""")


def variables_torch_reads() -> set[str]:
    """Every variable named in torch's compiler config modules (read from their source: nothing is imported)."""
    found: set[str] = set()
    for name in TORCH_CONFIG_MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin, name
        found |= set(TORCH_VARIABLE.findall(Path(spec.origin).read_text(encoding="utf-8")))
    return found


def test_every_variable_torch_config_reads_is_classified_once() -> None:
    torch_reads = variables_torch_reads()
    excluded = {name for name in EXCLUDED_ENV if not name.startswith("TORCH_NEURONX_")}
    assert len(TORCH_GRAPH_ENV) == len(set(TORCH_GRAPH_ENV))
    assert not set(TORCH_GRAPH_ENV) & excluded
    unclassified = torch_reads - set(TORCH_GRAPH_ENV) - excluded
    assert not unclassified, f"torch reads variables compile_env.py does not classify: {sorted(unclassified)}"
    gone = (set(TORCH_GRAPH_ENV) | excluded) - torch_reads
    assert not gone, f"compile_env.py classifies variables torch no longer reads: {sorted(gone)}"
    assert {"TORCHINDUCTOR_FREEZING", "TORCHINDUCTOR_MAX_AUTOTUNE", "TORCHINDUCTOR_CPP_WRAPPER"} <= GRAPH_ENV
    assert "TORCHINDUCTOR_CACHE_DIR" not in GRAPH_ENV  # a location, read outside the config modules


def test_compiler_variables_change_the_toolchain_only_where_they_apply() -> None:
    env = {
        "TORCHINDUCTOR_FREEZING": "1",
        "TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS": "1",
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
        "TORCH_NEURONX_COMPLEX_DECOMPOSE": "0",
        "HOME": "/x",
    }
    assert compile_env("cpu", "inductor", env) == (
        ("TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS", "1"),
        ("TORCHINDUCTOR_FREEZING", "1"),
    )
    assert compile_env("cpu", "aot_eager", env) == (("TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS", "1"),)
    assert ("TORCH_NEURONX_COMPLEX_DECOMPOSE", "0") in compile_env("neuron", "neuron", env)
    assert compile_env("cpu", "inductor", {"TORCHINDUCTOR_FREEZING": " "}) == ()  # empty reads as unset
    assert set(NEURON_GRAPH_ENV) <= GRAPH_ENV


def test_toolchain_hash_without_compiler_variables_is_what_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in GRAPH_ENV:
        monkeypatch.delenv(name, raising=False)
    base = current_toolchain("cpu", "inductor")
    # rows recorded before keep their identity
    assert "compile_env" not in base.as_dict() and "cuda_driver" not in base.as_dict()
    monkeypatch.setenv("TORCHINDUCTOR_FREEZING", "1")
    frozen = current_toolchain("cpu", "inductor")
    assert frozen.hash != base.hash and frozen.as_dict()["compile_env"] == {"TORCHINDUCTOR_FREEZING": "1"}
    assert (
        current_toolchain("cpu", "aot_eager").hash
        == dataclasses.replace(frozen, backend="aot_eager", compile_env=()).hash
    )
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "7")  # how many workers, not what they compile
    assert current_toolchain("cpu", "inductor").hash == frozen.hash


def test_the_nvidia_driver_version_is_read_from_either_module_wording() -> None:
    assert (
        nvidia_driver_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \nGCC"
        )
        == "580.159.04"
    )
    assert (
        nvidia_driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:15:33 UTC 2024")
        == "550.54.15"
    )
    assert nvidia_driver_version("") == "unknown"


def test_toolchain_differences_name_each_part() -> None:
    before = {"backend": "inductor", "packages": {"torch": "2.13.0", "transformers": "5.24.0"}, "neuron_cc_flags": ""}
    after = {
        **before,
        "packages": {"torch": "2.13.0", "transformers": "5.25.0"},
        "compile_env": {"TORCHINDUCTOR_FREEZING": "1"},
    }
    assert [str(d) for d in toolchain_differences(before, after)] == [
        "transformers 5.24.0 → 5.25.0",
        "inductor TORCHINDUCTOR_FREEZING unset → 1",
    ]
    assert toolchain_differences(before, dict(before)) == []


#: What a host computes before it touches any registry or cache: the identity of each planned shape.
HOST_CODE = (
    "from warmcache.manifest import load_manifest; from warmcache.identity.plan import "
    "plan_manifest; [print(p.model.name, p.spec.batch_size, p.identity) for p in "
    "plan_manifest(load_manifest('manifest.toml'))]"
)


def test_two_hosts_compute_the_same_identity(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """Two "hosts": own model copy, cache folders, host name, user, working directory and registry file."""
    identities = []
    for host in ("host-a", "host-b"):
        root = tmp_path / host
        shutil.copytree(tiny_models["qwen3"], root / "models" / "tiny")
        manifest = root / "manifest.toml"
        manifest.write_text(
            manifest_toml(
                model("m", "models/tiny", backend="inductor", generate=[generate(batch_sizes=[1, 2])]),
                model("n", "models/tiny", device="neuron", backend="neuron", generate=[generate()]),
                registry={"url": str(root / "registry.sqlite")},
                cache={"dir": str(root / "cache")},
            )
        )
        env = {
            **os.environ,
            "HOSTNAME": host,
            "USER": host,
            "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "TORCH_COMPILE_DEBUG_DIR": str(root / "debug"),
            "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1" if host == "host-a" else "0",
            "NEURON_CC_FLAGS": f"--cache_dir={root / 'neuron'} -O1",
            "NEURON_COMPILE_CACHE_URL": f"s3://{host}-bucket/cache",
            "TORCH_NEURONX_NEFF_CACHE_DIR": str(root / "neff"),
        }
        result = subprocess.run(
            [sys.executable, "-c", HOST_CODE],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        identities.append(result.stdout.split("\n"))
    assert identities[0] == identities[1] and len(identities[0]) == 4  # three shapes and the last newline


@pytest.fixture
def warmed(write_manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """An Inductor manifest whose batch 1 and 4 are compiled (through the registry's real claim path)."""
    for name in GRAPH_ENV:
        monkeypatch.delenv(name, raising=False)
    path = write_manifest(manifest_toml(model("m", backend="inductor", generate=[generate(batch_sizes=[1, 4, 8])])))
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    mark_all_compiled(url, [p for p in plan_manifest(load_manifest(path)) if p.spec.batch_size != 8])
    return path, url


def _explain(path: Path, url: str) -> list[dict]:
    result = CliRunner().invoke(main, ["explain", str(path), "--db", url, "--json"])
    explained = json.loads(result.output)
    assert result.exit_code == (1 if explained else 0), result.output  # 1: anything explained is not usable here
    return explained


def test_explain_names_the_differing_variable_and_the_nearest_bucket(
    warmed: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, url = warmed
    assert [(e["batch_size"], e["reason"]) for e in _explain(path, url)] == [
        (8, "missing: no row for batch=8; nearest compiled batch=4")
    ]

    monkeypatch.setenv("TORCHINDUCTOR_FREEZING", "1")
    explained = _explain(path, url)
    assert [(e["batch_size"], e["status"]) for e in explained] == [(1, "stale"), (4, "stale"), (8, "missing")]
    assert explained[0]["reason"] == "stale: inductor TORCHINDUCTOR_FREEZING unset → 1"
    assert explained[0]["differences"] == [
        {"field": "inductor TORCHINDUCTOR_FREEZING", "recorded": "unset", "current": "1"}
    ]
    assert explained[2]["reason"] == "missing: no row for batch=8 seq=8; nothing of this family is compiled here yet"
    text = CliRunner().invoke(main, ["explain", str(path), "--db", url])
    assert (
        "batch=1 seq=8: stale: inductor TORCHINDUCTOR_FREEZING unset → 1" in text.output
        and "3 of 3 shapes not usable here" in text.output
    )

    plan = json.loads(CliRunner().invoke(main, ["plan", str(path), "--db", url, "--json"]).output)
    assert [p["reason"] for p in plan] == [e["reason"] for e in explained]


def test_a_guard_over_stale_rows_names_what_differs(warmed: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = warmed
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    local_toolchain_hash.cache_clear()
    try:
        with pytest.raises(UsageError, match="stale here: inductor TORCHINDUCTOR_MAX_AUTOTUNE unset → 1"):
            ShapeGuard.from_registry(url, "m", telemetry=False)
        check = CliRunner().invoke(main, ["check", "--model", "m", "--batch", "1", "--seq", "8", "--db", url])
        assert check.exit_code == 1 and "stale: inductor TORCHINDUCTOR_MAX_AUTOTUNE unset → 1" in check.output
    finally:
        local_toolchain_hash.cache_clear()


def test_attn_implementation_is_part_of_the_identity(write_manifest, tmp_path: Path) -> None:
    def planned(**keys: str) -> list[str]:
        path = write_manifest(manifest_toml(model("m", backend="aot_eager", generate=[generate()], **keys)))
        return [p.identity for p in plan_manifest(load_manifest(path))]

    default, eager, sdpa = planned(), planned(attn_implementation="eager"), planned(attn_implementation="sdpa")
    assert len({*default, *eager, *sdpa}) == 3

    path = write_manifest(
        manifest_toml(model("m", backend="aot_eager", attn_implementation="eager", generate=[generate()]))
    )
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    mark_all_compiled(url, plan_manifest(load_manifest(path)))
    config = json.loads((Path(load_manifest(path).models[0].path) / "config.json").read_text())
    guard = ShapeGuard.from_registry(url, "m", telemetry=False)
    with pytest.raises(
        UsageError,
        match="attn_implementation 'sdpa' matches no compiled rows .compiled with attn_implementation 'eager'",
    ):
        guard.check_model_config(config, "sdpa")
    guard.check_model_config(config, "eager")
    other = write_manifest(
        manifest_toml(model("m", backend="aot_eager", attn_implementation="sdpa", generate=[generate()])),
        name="sdpa.toml",
    )
    (explained,) = _explain(other, url)
    assert explained["reason"] == "stale: model attn_implementation eager → sdpa"


#: Shape hashes computed before the shape family carried typed settings: a row's identity must not move.
PINNED_SHAPE_HASHES = {
    "m/generate bfloat16 max_cache_len=16 batch=1 seq=8": "38eebc0ed170157c95c8",
    "m/generate bfloat16 max_cache_len=16 batch=2 seq=8": "875959e4acf97b232d39",
    "m/generate bfloat16 max_cache_len=64 batch=4 seq=32": "dae08cfab75cda41e0ea",
    "m/train bfloat16 batch=2 seq=8": "5b6334c3faa7c1bdf04b",
    "m/train bfloat16 batch=1 seq=16": "4ef509364d451edc19b9",
    "d/generate float32 max_cache_len=16 tp=2,fsdp=1 batch=1 seq=8": "4a267cc04ec302a4b022",
}


def test_shape_hashes_and_stored_settings_are_what_they_were() -> None:
    defaults = generate((1, 2), (8,), 16)
    beams = generate(
        (4,),
        (32,),
        64,
        num_beams=2,
        num_return_sequences=2,
        do_sample=True,
        prefill_chunk_size=16,
        cache_implementation="hybrid",
    )
    text = manifest_toml(
        model(
            "m",
            "/hub/m",
            generate=[defaults, beams],
            train=[train((2,), (8,)), train((1,), (16,), bf16=True, gradient_checkpointing=True)],
            dtype="bfloat16",
        ),
        model("d", "/hub/d", generate=[generate((1,), (8,), 16)], distributed={"tp_size": 2, "fsdp_size": 1}),
    )
    manifest = loads(text, Path("/manifests/warmcache.toml"))
    specs = manifest.specs()
    assert {s.describe(): s.shape_hash for s in specs} == PINNED_SHAPE_HASHES
    toolchain = current_toolchain("cpu", "inductor")
    stored = {
        s.describe(): pending_row_values(PlannedShape(s, manifest.model(s.model), "config", toolchain))["settings"]
        for s in specs[2:4]
    }
    assert stored == {
        "m/generate bfloat16 max_cache_len=64 batch=4 seq=32": {
            "cache_implementation": "hybrid",
            "do_sample": True,
            "num_beams": 2,
            "num_return_sequences": 2,
            "prefill_chunk_size": 16,
        },
        "m/train bfloat16 batch=2 seq=8": {"bf16": False, "gradient_checkpointing": False},
    }
