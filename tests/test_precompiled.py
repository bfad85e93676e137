"""Precompiled decode artifacts (aot_eager, tiny Qwen3): a fresh process serves without Dynamo; the registry is the
guard."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.artifacts.format import Fingerprint, Header, read_checked, write_artifact
from warmcache.cache.layout import INDUCTOR_PRECOMPILED, entry_of
from warmcache.errors import CacheError
from warmcache.registry import Registry

MAX_CACHE_LEN = 32
MANIFEST = manifest_toml(
    model(
        "m",
        "{path}",
        backend="aot_eager",
        precompile=True,
        generate=[generate(batch_sizes=[1, 2], max_cache_len=MAX_CACHE_LEN)],
    ),
    registry={"url": "sqlite:///{root}/registry.sqlite"},
    cache={"dir": "{root}/cache"},
)

#: Runs in a fresh interpreter: prime from the registry, serve requests, report Dynamo's counters and tokens vs eager.
SERVE = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM
    from warmcache.errors import UnseenShapeError
    from warmcache.runtime.guard import ShapeGuard

    url, path, policy = sys.argv[1:4]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    guard = ShapeGuard.from_registry(url, "m", telemetry=False, policy=policy)
    try:
        report = guard.prime(model, **({"cache_dir": sys.argv[4]} if len(sys.argv) > 4 else {}))
    except Exception as exc:
        print(json.dumps({"prime_error": f"{type(exc).__name__}: {exc}"}))
        sys.exit(0)
    from torch._dynamo.utils import counters
    frames_after_prime = sum(counters["frames"].values())
    same, served = [], []
    for batch, length in ((1, 5), (2, 8), (2, 3), (1, 8)):
        ids = torch.randint(5, 300, (batch, length), generator=torch.Generator().manual_seed(batch * 100 + length))
        out = guard.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6)
        mask = torch.ones_like(ids)
        eager = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, disable_compile=True, pad_token_id=0
        )
        same.append(out.tolist() == eager.tolist())
        served.append([batch, length])
    try:
        guard.generate(model, input_ids=torch.ones(3, 40, dtype=torch.long), max_new_tokens=2)
        refused = None
    except UnseenShapeError as exc:
        refused = str(exc)
    decoder = model.get_compiled_call(model._last_compile_config) if hasattr(model, "_last_compile_config") else None
    print(json.dumps({
        "artifacts_loaded": report.artifacts_loaded,
        "artifact_errors": report.artifact_errors,
        "frames": sum(counters["frames"].values()) ,
        "frames_after_prime": frames_after_prime,
        "graphs": int(counters["stats"]["unique_graphs"]),
        "same_as_eager": same,
        "refused": refused,
    }))
    """
)


@pytest.fixture(scope="module")
def warmed(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A registry and cache filled by the real ``warmcache warmup`` with ``precompile = true``."""
    root = tmp_path_factory.mktemp("precompiled")
    manifest = root / "manifest.toml"
    manifest.write_text(MANIFEST.format(root=root, path=tiny_models["qwen3"]))
    subprocess.run(
        [sys.executable, "-m", "warmcache", "warmup", str(manifest)], check=True, capture_output=True, text=True
    )
    return root


def _serve(root: Path, model: Path, policy: str = "pad", *extra: str) -> dict[str, Any]:
    env_script = root / "serve.py"
    env_script.write_text(SERVE)
    result = subprocess.run(
        [sys.executable, str(env_script), f"sqlite:///{root}/registry.sqlite", str(model), policy, *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _artifacts(root: Path) -> dict[int, str]:
    """``{batch: entry path}`` of the precompiled artifacts the registry rows recorded."""
    with Registry.open(f"sqlite:///{root}/registry.sqlite") as registry:
        rows = registry.rows(model="m", with_artifacts=True)
    found: dict[int, set[str]] = {}
    for row in rows:
        found.setdefault(row.batch_size, set()).update(a.path for a in row.artifacts if a.kind == INDUCTOR_PRECOMPILED)
    assert all(len(paths) == 1 for paths in found.values()), found
    return {batch: paths.pop() for batch, paths in found.items()}


@pytest.mark.slow
def test_fresh_process_serves_from_artifacts_with_zero_dynamo_frames(
    warmed: Path, tiny_models: dict[str, Path]
) -> None:
    served = _serve(warmed, tiny_models["qwen3"])
    assert served["artifacts_loaded"] == 2 and served["artifact_errors"] == []
    assert served["frames"] == 0 and served["graphs"] == 0, served
    assert served["same_as_eager"] == [True] * 4
    # No artifact, no bucket: a request beyond every bucket is refused exactly as without artifacts.
    assert served["refused"] and "fits no compiled shape" in served["refused"]


@pytest.mark.slow
def test_each_batch_has_its_own_artifact_with_its_own_fingerprint(warmed: Path) -> None:
    artifacts = _artifacts(warmed)
    assert sorted(artifacts) == [1, 2] and artifacts[1] != artifacts[2]
    assert all(entry_of("inductor", path) == (INDUCTOR_PRECOMPILED, path) for path in artifacts.values())
    data = (warmed / "cache" / artifacts[2]).read_bytes()
    header = json.loads(data.split(b"\n")[1])
    assert header["fingerprint"]["batch_size"] == 2
    assert ["input_ids", [2, 1], "torch.int64"] in header["fingerprint"]["signature"]


@pytest.mark.slow
def test_tampered_artifact_is_refused_before_unpickling(
    warmed: Path, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(warmed, copy, ignore=shutil.ignore_patterns("*.py"))
    entry = _artifacts(copy)[1]
    path = copy / "cache" / entry
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    # The rows name the original folder; point the guard at the tampered copy.
    refused = _serve(copy, tiny_models["qwen3"], "pad", str(copy / "cache"))
    assert "prime_error" in refused and "sha256" in refused["prime_error"] and str(path) in refused["prime_error"]
    assert "\n" not in refused["prime_error"]
    # Under warn too: an altered artifact is a refusal, never a bucket to trace instead.
    warned = _serve(copy, tiny_models["qwen3"], "warn", str(copy / "cache"))
    assert warned["prime_error"].startswith("TrustError: ") and "sha256" in warned["prime_error"]
    # A missing one under warn is traced from the compile path; the other still loads; tokens stay right.
    path.unlink()
    missing = _serve(copy, tiny_models["qwen3"], "warn", str(copy / "cache"))
    assert (
        missing["artifacts_loaded"] == 1
        and len(missing["artifact_errors"]) == 1
        and "unreadable" in missing["artifact_errors"][0]
    )
    assert missing["same_as_eager"] == [True] * 4 and missing["frames"] > 0


def test_decoder_never_runs_an_artifact_on_another_signature(tiny_models: dict[str, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.artifacts.dispatch import PrecompiledDecoder
    from warmcache.artifacts.format import decode_signature
    from warmcache.modeling.generation import compile_config

    model = AutoModelForCausalLM.from_pretrained(tiny_models["qwen3"], dtype=torch.float32)
    captured: list[dict[str, Any]] = []

    def spy(config: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs["input_ids"].shape[-1] == 1:
                captured.append(dict(kwargs))
            return model(*args, **kwargs)

        return call

    model.get_compiled_call = spy  # type: ignore[method-assign]
    for batch in (1, 2):
        ids = torch.ones(batch, 4, dtype=torch.long)
        model.generate(
            input_ids=ids, max_new_tokens=2, min_new_tokens=2,
            cache_implementation="static", max_cache_len=MAX_CACHE_LEN,
            pad_token_id=0, compile_config=compile_config("eager", "default", "cpu"),
        )  # fmt: skip
    del model.get_compiled_call
    one, two = captured[0], captured[-1]
    ran: list[str] = []
    decoder = PrecompiledDecoder(model, fallback=lambda: lambda *a, **k: ran.append("fallback"))
    decoder.by_signature[decode_signature(one)] = lambda m, **k: ran.append("artifact")
    decoder(**two)  # batch 2 never meets the batch-1 artifact
    decoder(**one)
    assert ran == ["fallback", "artifact"]
    assert decode_signature({**one, "logits_to_keep": 2}) != decode_signature(one)


def _header(batch: int = 1) -> Header:
    fingerprint = Fingerprint(
        "cfg",
        "tool",
        batch,
        MAX_CACHE_LEN,
        "float32",
        "inductor",
        "default",
        (("input_ids", (batch, 1), "torch.int64"),),
    )
    return Header(fingerprint, {})


def test_artifact_checks_sha256_and_fingerprint_without_unpickling(tmp_path: Path) -> None:
    entry = write_artifact(tmp_path, _header(), b"not a pickle: never read as one")
    row = {
        "config_hash": "cfg",
        "toolchain_hash": "tool",
        "batch_size": 1,
        "max_cache_len": MAX_CACHE_LEN,
        "dtype": "float32",
    }
    header, payload = read_checked(tmp_path, entry, row)
    assert header == _header() and payload == b"not a pickle: never read as one"
    with pytest.raises(CacheError, match="another toolchain_hash"):
        read_checked(tmp_path, entry, {**row, "toolchain_hash": "upgraded"})
    with pytest.raises(CacheError, match="another batch_size"):
        read_checked(tmp_path, entry, {**row, "batch_size": 4})
    (tmp_path / entry).write_bytes((tmp_path / entry).read_bytes() + b"x")
    with pytest.raises(CacheError, match="sha256"):
        read_checked(tmp_path, entry, row)
    (tmp_path / entry).unlink()
    with pytest.raises(CacheError, match="unreadable"):
        read_checked(tmp_path, entry, row)


@pytest.mark.slow
def test_bundle_carries_the_artifacts(warmed: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from warmcache.cli import main

    bundle = tmp_path / "b.tar"
    result = CliRunner().invoke(main, ["bundle", "pack", str(warmed / "manifest.toml"), "-o", str(bundle)])
    assert result.exit_code == 0, result.output
    target_db = f"sqlite:///{tmp_path / 'other.sqlite'}"
    unpack = ["bundle", "unpack", str(bundle), "--cache-dir", str(tmp_path / "cache"), "--db", target_db]
    refused = CliRunner().invoke(main, unpack)  # a pickled graph from an unverified source is not installed by default
    assert refused.exit_code == 5 and "--allow-unsigned" in refused.output and not (tmp_path / "cache").exists()
    result = CliRunner().invoke(main, [*unpack, "--allow-unsigned"])
    assert result.exit_code == 0, result.output
    for entry in _artifacts(warmed).values():
        assert (tmp_path / "cache" / entry).read_bytes() == (warmed / "cache" / entry).read_bytes()
    scan = CliRunner().invoke(
        main, ["cache", "scan", "--cache-dir", str(tmp_path / "cache"), "--db", target_db, "--json"]
    )
    assert scan.exit_code == 0, scan.output
    assert INDUCTOR_PRECOMPILED in scan.output


@pytest.mark.slow
def test_verify_fails_a_spec_whose_artifact_was_tampered(warmed: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from warmcache.cli import main

    copy = tmp_path / "copy"
    shutil.copytree(warmed, copy, ignore=shutil.ignore_patterns("*.py"))
    (copy / "manifest.toml").write_text((warmed / "manifest.toml").read_text().replace(str(warmed), str(copy)))
    artifacts = _artifacts(copy)
    path = copy / "cache" / artifacts[2]
    path.write_bytes(path.read_bytes()[:-1] + b"!")
    result = CliRunner().invoke(main, ["verify", str(copy / "manifest.toml"), "--json"])
    report = json.loads(result.output[result.output.index("{") :])
    verdicts = {spec["spec"]: spec for spec in report["specs"]}
    failed = [v for v in verdicts.values() if v["verdict"] == "disproven"]
    assert result.exit_code == 1 and len(failed) == 1 and "batch=2" in failed[0]["spec"]
    assert "sha256" in failed[0]["reason"] and "\n" not in failed[0]["reason"]
    assert report["disproven"] == 1 and report["replay_failed"] == 0
    # The untouched batch-1 artifact was loaded, run and matched the traced path's tokens.
    assert [v["verdict"] for v in verdicts.values() if "batch=1" in v["spec"]] == ["replay-only"]


@pytest.mark.parametrize("target", [{"device": "neuron"}, {"backend": "eager"}, {"mode": "max-autotune"}])
def test_manifest_refuses_precompile_where_it_cannot_be_saved(target: dict[str, str], write_manifest) -> None:  # type: ignore[no-untyped-def]
    from warmcache.errors import ManifestError
    from warmcache.manifest import load_manifest

    path = write_manifest(manifest_toml(model("m", **target, precompile=True, generate=[generate(max_cache_len=32)])))
    with pytest.raises(ManifestError, match=r"model\[0\]\.precompile"):
        load_manifest(path)


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ({"precompile": True, "package_prefill": False}, "applies only with precompile = 'aotinductor'"),
        ({"package_prefill": True}, "applies only with precompile = 'aotinductor'"),
        ({"precompile": "aotinductor", "package_prefill": "no"}, "must be true or false, got 'no' (str)"),
    ],
    ids=["aot_compile", "no precompile", "not a boolean"],
)
def test_manifest_refuses_package_prefill_off_the_aotinductor_route(
    keys: dict[str, Any], problem: str, write_manifest
) -> None:  # type: ignore[no-untyped-def]
    from warmcache.errors import ManifestError
    from warmcache.manifest import load_manifest

    path = write_manifest(manifest_toml(model("m", backend="inductor", **keys, generate=[generate(max_cache_len=32)])))
    with pytest.raises(ManifestError) as refused:
        load_manifest(path)
    assert refused.value.problems == [f"{path}: model 'm': model[0].package_prefill: {problem}"]


def test_package_prefill_is_on_by_default_and_read_from_the_manifest(write_manifest) -> None:  # type: ignore[no-untyped-def]
    from warmcache.manifest import load_manifest

    declared = [
        model(f"m{i}", backend="inductor", precompile="aotinductor", **keys, generate=[generate(max_cache_len=32)])
        for i, keys in enumerate([{}, {"package_prefill": False}])
    ]
    loaded = load_manifest(write_manifest(manifest_toml(*declared)))
    assert [m.package_prefill for m in loaded.models] == [True, False]
