"""AOTInductor decode packages (tiny Llama, Inductor): a fresh process serves generate() with no compiler at all.

The packages are built once per session (each AOTInductor compile costs 20-40 s on
a 2-core machine) and shared by every test here; the refusal tests never load one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from warmcache_testkit.manifests import generate, manifest_toml, model
from warmcache_testkit.model_patch import mlp_scaled_env
from warmcache_testkit.serving_check import assert_served_by_packages, serve

from warmcache.cache.layout import AOTINDUCTOR, entry_of
from warmcache.errors import CacheError, ManifestError, UsageError
from warmcache.registry import Registry

MAX_CACHE_LEN = 16
PROMPT = 8
BATCHES = (1, 4)
#: Ragged requests (each row's prompt length), served by the batch-1 and batch-4 packages.
REQUESTS = ((5,), (8, 3, 6), (2, 8, 7, 4), (8, 8, 8, 8))


def warm_packages(
    root: Path, model_path: Path, device: str, batches: Sequence[int] = BATCHES, package_prefill: bool = True
) -> Path:
    """A registry and cache filled by the real ``warmcache warmup`` and ``warmcache verify``.

    With ``precompile = "aotinductor"`` (and ``package_prefill``: a test that serves no mount skips the prefill's
    compile).
    """
    manifest = root / "manifest.toml"
    declared = model(
        "m",
        str(model_path),
        device=device,
        backend="inductor",
        precompile="aotinductor",
        package_prefill=package_prefill,
        generate=[generate(batches, [PROMPT], MAX_CACHE_LEN)],
    )
    manifest.write_text(
        manifest_toml(declared, registry={"url": f"sqlite:///{root}/registry.sqlite"}, cache={"dir": f"{root}/cache"})
    )
    for command in ("warmup", "verify"):
        done = subprocess.run(
            [sys.executable, "-m", "warmcache", command, str(manifest), "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, f"{command}: {done.stderr[-3000:]}"
        (root / f"{command}.stderr").write_text(done.stderr)  # its plain progress lines
    return root


def _serve(root: Path, model_path: Path, device: str = "cpu") -> dict[str, Any]:
    return serve(root, model_path, REQUESTS, prompt=PROMPT, max_cache_len=MAX_CACHE_LEN, device=device)


def _rows(root: Path) -> dict[int, Any]:
    with Registry.open(f"sqlite:///{root}/registry.sqlite") as registry:
        return {row.batch_size: row for row in registry.rows(model="m", with_artifacts=True)}


def package_steps(row: Any) -> dict[str, str]:
    """The row's AOTInductor packages by the step each header names (``decode``, ``prefill``)."""
    from warmcache.artifacts.package_steps import package_step

    root = Path(row.cache_root) if getattr(row, "cache_root", None) else None
    steps: dict[str, str] = {}
    for artifact in row.artifacts:
        if artifact.kind != AOTINDUCTOR:
            continue
        header = json.loads((root / artifact.path).read_bytes().split(b"\n")[1]) if root else {}
        step = package_step(header.get("aotinductor") or {})
        assert step not in steps, f"two {step} packages in one row: {steps[step]}, {artifact.path}"
        steps[step] = str(artifact.path)
    return steps


def _package(row: Any, step: str = "decode") -> str:
    """The row's decode package (or its packaged prefill), told apart by the step its header names."""
    return package_steps(row)[step]


def _assert_served_by_packages(served: dict[str, Any]) -> None:
    assert_served_by_packages(served, packages=len(BATCHES), min_calls=len(REQUESTS) * (MAX_CACHE_LEN - PROMPT))


@pytest.mark.slow
def test_warmup_and_verify_say_each_phase_of_the_package_route(packaged: Path) -> None:
    # The reference decode is eager and runs only the short call the package is exported from; verify proves the package
    # to the cache's end.
    for command, then in (
        (
            "warmup",
            ["exporting the decode step", "building the package", "exporting the prefill", "building the package"],
        ),
        ("verify", ["proving the decode through warmcache's cache", "proving the precompiled artifact"]),
    ):
        said = (packaged / f"{command}.stderr").read_text()
        loads = 0
        for batch in BATCHES:
            spec = f"m/generate float32 max_cache_len={MAX_CACHE_LEN} batch={batch} seq={PROMPT}: "
            # Each phase as it starts, less how long the one before took.
            phases = [
                re.sub(r" \([^()]* took [^()]*\)$", "", line[len(spec) :])
                for line in said.splitlines()
                if line.startswith(spec) and " for " not in line
            ]
            if phases[:1] == ["loading the model"]:
                loads += 1
                phases = phases[1:]
            assert phases == ["eager first decode steps", *then], said
        assert loads == 1  # the first spec loads the model, the other reuses it
    warmup = (packaged / "warmup.stderr").read_text()
    # torch's LeafSpec FutureWarning (its own graph copy inside aoti_compile_and_package) is silenced at that call
    assert "Warning" not in warmup, warmup
    # and "0 graphs" says why: the decode step was exported, not traced by Dynamo
    assert warmup.count("(decode step exported to an AOTInductor package, no Dynamo graph, ") == len(BATCHES), warmup


@pytest.mark.slow
def test_fresh_process_serves_ragged_requests_from_packages_without_the_compiler(
    packaged: Path, tiny_models: dict[str, Path]
) -> None:
    _assert_served_by_packages(_serve(packaged, tiny_models["llama"]))


@pytest.mark.slow
def test_each_bucket_has_one_verified_package_without_weights(packaged: Path) -> None:
    rows = _rows(packaged)
    assert sorted(rows) == list(BATCHES) and all(row.status == "verified" for row in rows.values())
    entries = {batch: _package(row) for batch, row in rows.items()}
    assert len(set(entries.values())) == len(BATCHES) and all(
        entry_of("inductor", e) == (AOTINDUCTOR, e) for e in entries.values()
    )
    data = (packaged / "cache" / entries[4]).read_bytes()
    header = json.loads(data.split(b"\n")[1])
    assert header["fingerprint"]["batch_size"] == 4 and header["aotinductor"]["cpu_capability"]
    assert ["input_ids", [4, 1], "torch.int64"] in header["aotinductor"]["inputs"]
    assert "model.lm_head.weight" in header["aotinductor"]["constants"]


@pytest.mark.slow
def test_verify_fails_a_package_whose_graph_the_model_no_longer_computes(packaged: Path, tmp_path: Path) -> None:
    """The package runs warmup's graph whatever the model's code is now; verify exports the model again and compares
    (exact, so a change bfloat16 rounding hides fails too), before judging a single logit."""
    copy = tmp_path / "copy"
    shutil.copytree(packaged, copy)
    manifest = copy / "manifest.toml"
    manifest.write_text(manifest.read_text().replace(str(packaged), str(copy)))
    done = subprocess.run(
        [sys.executable, "-m", "warmcache", "verify", str(manifest)],
        capture_output=True,
        text=True,
        check=False,
        env=mlp_scaled_env(tmp_path / "patch", "llama", "LlamaMLP"),
    )
    assert done.returncode != 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    for batch in BATCHES:
        row = _rows(packaged)[batch]
        # Either of the bucket's packages may be the first verify finds changed: the decode or the packaged prefill.
        entries = "|".join(_package(row, step) for step in ("decode", "prefill"))
        refused = rf"batch={batch} .*AOTInductor package ({entries}) computes another graph than this model"
        assert re.search(refused, said), said
    assert "logits" not in said  # refused on the graph, before any decode was judged
    # Production must not load them: both rows go back to failed, for warmup --retry-failed to build again.
    with Registry.open(f"sqlite:///{copy}/registry.sqlite") as registry:
        rows = registry.rows(model="m")
    assert [(r.status, "computes another graph" in (r.error or "")) for r in rows] == [("failed", True)] * len(BATCHES)


@pytest.mark.slow
def test_tampered_package_is_refused_before_loading(
    packaged: Path, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from warmcache.artifacts.aoti_loader import load_package
    from warmcache.artifacts.code_check import ModelCodeCheck
    from warmcache.artifacts.route import expected_fingerprint

    row = _rows(packaged)[1]
    entry = _package(row)
    (tmp_path / entry).parent.mkdir(parents=True)
    data = bytearray((packaged / "cache" / entry).read_bytes())
    data[-100] ^= 0xFF
    (tmp_path / entry).write_bytes(bytes(data))
    model = _model(tiny_models["llama"])
    with pytest.raises(CacheError, match=r"sha256 .* differs from its registry record") as refused:
        load_package(tmp_path, entry, expected_fingerprint(row), model, ModelCodeCheck(model))
    assert "\n" not in str(refused.value) and str(tmp_path / entry) in str(refused.value)


@pytest.mark.slow
def test_package_of_another_batch_size_is_refused_before_loading(packaged: Path, tiny_models: dict[str, Path]) -> None:
    from warmcache.artifacts.aoti_loader import load_package
    from warmcache.artifacts.code_check import ModelCodeCheck
    from warmcache.artifacts.route import expected_fingerprint

    rows = _rows(packaged)
    model = _model(tiny_models["llama"])
    with pytest.raises(CacheError, match=r"compiled for another batch_size: batch_size=4 \(row: 1\)") as refused:
        load_package(packaged / "cache", _package(rows[4]), expected_fingerprint(rows[1]), model, ModelCodeCheck(model))
    assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_model_whose_config_differs_from_the_rows_is_refused_before_loading(
    packaged: Path, tiny_models: dict[str, Path]
) -> None:
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
    from warmcache.artifacts.aoti_loader import cpu_can_run

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
def test_manifest_refuses_what_a_package_cannot_serve(
    keys: dict[str, Any], workload: dict[str, Any], at: str, write_manifest
) -> None:  # type: ignore[no-untyped-def]
    from warmcache.manifest import load_manifest

    declared = {"precompile": "aotinductor", "backend": "inductor", **keys}
    path = write_manifest(manifest_toml(model("m", **declared, generate=[generate(max_cache_len=32, **workload)])))
    with pytest.raises(ManifestError, match=at):
        load_manifest(path)


@pytest.mark.slow
@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(),
    reason="no CUDA device on this machine (CI has none); runs on a GPU host",
)
def test_cuda_serves_from_packages_without_the_compiler(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    root = warm_packages(tmp_path, tiny_models["llama"], "cuda")
    served = _serve(root, tiny_models["llama"], "cuda")
    # the figures tools/ci/cuda_aoti_check.sh collects
    print(json.dumps({k: v for k, v in served.items() if k != "results"}))
    _assert_served_by_packages(served)
    shutil.rmtree(root / "cache", ignore_errors=True)


@pytest.mark.slow
def test_packages_run_the_weights_of_the_model_that_loads_them(
    packaged: Path, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Another checkpoint of the same config shares the packages: its own weights are bound, its own tokens come out."""
    import torch

    from warmcache.examples.tiny_model import build_tiny_model
    from warmcache.runtime.guard import ShapeGuard

    other = _model(build_tiny_model("llama", tmp_path / "other", seed=1))
    guard = ShapeGuard.from_registry(f"sqlite:///{packaged}/registry.sqlite", "m", telemetry=False)
    assert guard.prime(other).artifacts_loaded == len(BATCHES)
    ids = torch.randint(5, 300, (1, PROMPT), generator=torch.Generator().manual_seed(7))
    out = guard.generate(other, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6)
    eager = other.generate(
        input_ids=ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, disable_compile=True, pad_token_id=0
    )
    original = _model(tiny_models["llama"]).generate(
        input_ids=ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, disable_compile=True, pad_token_id=0
    )
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

    from warmcache.artifacts.aoti_loader import PackagedDecodeStep

    step = PackagedDecodeStep(
        loader=None,
        inputs=[("cache.layers[0].keys", (1, 2, 4, 8), "torch.float32")],
        fixed={},
        device="cpu",
        where="pkg",
    )
    step._check(["cache.layers[0].keys"], [torch.zeros(1, 2, 4, 8)], {})
    for bad in (
        torch.zeros(1, 2, 8, 4).transpose(2, 3),
        torch.zeros(2, 2, 4, 8),
        torch.zeros(1, 2, 4, 8, dtype=torch.float16),
    ):
        with pytest.raises(UsageError, match="differs from the package's"):
            step._check(["cache.layers[0].keys"], [bad], {})
    with pytest.raises(UsageError, match="is not the one the package was built for"):
        step._check(["cache.layers[0].keys"], [torch.zeros(1, 2, 4, 8)], {"logits_to_keep": 2})


#: Runs in a fresh interpreter: every snapshot case under every policy (over a file, and over plain HTTP for the URL
#: cases), then whether the marker a swapped-in ``.so`` writes from its constructor exists. The correctly signed case
#: comes last.
ATTACK = textwrap.dedent(
    """
    import http.server, json, sys, threading
    from pathlib import Path
    import torch
    from transformers import AutoModelForCausalLM
    from warmcache.runtime.guard import ShapeGuard

    model_path, cases_file, marker = sys.argv[1:4]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    served = {}

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(served["body"])

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    results = {}
    for case in json.loads(Path(cases_file).read_text()):
        served["body"] = Path(case["path"]).read_bytes()
        for policy in ("pad", "refuse", "warn"):
            try:
                if case["url"]:
                    url = f"http://127.0.0.1:{server.server_port}"
                    guard = ShapeGuard.from_url(url, "m", policy=policy, telemetry=False, trust=case["trust"])
                else:
                    guard = ShapeGuard.from_snapshot(case["path"], "m", policy=policy, trust=case["trust"])
                report = guard.prime(model, cache_dir=case["cache_dir"])
                outcome = (
                    f"primed: {report.artifacts_loaded} loaded, {report.graphs} graphs, "
                    f"{report.cache_misses} cache misses"
                )
            except Exception as exc:
                outcome = f"{type(exc).__name__}: {exc}"
            results[f"{case['name']}/{policy}"] = [outcome, Path(marker).exists()]
    print(json.dumps(results))
    """
)

#: A shared object whose constructor runs at dlopen and leaves a file behind: what a swapped package ``.so`` could do.
CONSTRUCTOR = (
    "#include <stdio.h>\n__attribute__((constructor)) static void planted(void) { FILE *f = "
    'fopen("%s", "w"); if (f) { fputs("ran", f); fclose(f); } }\n'
)


def _swapped_package(real: Path, evil_so: Path, into: Path) -> str:
    """A copy of the package file ``real`` with its compiled ``.so`` replaced, written under ``into`` by its own
    sha256; returns the entry."""
    import hashlib
    import io
    import zipfile

    from warmcache.artifacts.format import MAGIC

    data = real.read_bytes()
    end = data.index(b"\n", len(MAGIC))
    source, swapped = zipfile.ZipFile(io.BytesIO(data[end + 1 :])), io.BytesIO()
    with zipfile.ZipFile(swapped, "w", zipfile.ZIP_STORED) as out:
        for info in source.infolist():
            out.writestr(info, evil_so.read_bytes() if info.filename.endswith(".so") else source.read(info))
    forged = data[: end + 1] + swapped.getvalue()
    entry = f"aotinductor/{hashlib.sha256(forged).hexdigest()}"
    (into / entry).parent.mkdir(parents=True, exist_ok=True)
    (into / entry).write_bytes(forged)
    return entry


@pytest.mark.slow
def test_a_snapshot_nobody_vouches_for_never_loads_its_native_code(
    packaged: Path, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Unsigned, signed by another key, or leading out of the cache folder: refused before any dlopen under every
    policy, over a file and over plain HTTP; the same rows signed by the trusted key prime from their packages with
    nothing compiled."""
    from warmcache.runtime.snapshot import snapshot_document
    from warmcache.trust import SigningKey, generate_key, sign_document

    marker, evil_root = tmp_path / "constructor-ran", tmp_path / "attacker"
    (tmp_path / "planted.c").write_text(CONSTRUCTOR % marker)
    evil_so = tmp_path / "planted.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(evil_so), str(tmp_path / "planted.c")], check=True)
    # The control: loading the swapped-in object does run its constructor, so a missing marker below means it was never
    # loaded.
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(evil_so)!r})"], check=True)
    assert marker.exists()
    marker.unlink()

    rows = _rows(packaged)
    forged = _swapped_package(packaged / "cache" / _package(rows[1]), evil_so, evil_root)
    document = snapshot_document(list(rows.values()), "build host")
    for record in document["records"]:
        record["cache_root"] = str(evil_root)
        record["artifacts"] = [
            {**a, "path": forged} if record["batch_size"] == 1 and a["kind"] == AOTINDUCTOR else a
            for a in record["artifacts"]
        ]
    keys = {name: tmp_path / name for name in ("ours", "theirs")}
    for key in keys.values():
        generate_key(key)
    # A cache folder of this host where the forged entry is a link to the attacker's file.
    linked = tmp_path / "linked"
    shutil.copytree(packaged / "cache", linked, symlinks=True)
    (linked / forged).symlink_to(evil_root / forged)
    files = {
        "unsigned": document,
        "theirs": sign_document(document, SigningKey.load(keys["theirs"])),
        "ours": sign_document(document, SigningKey.load(keys["ours"])),
        "genuine": sign_document(snapshot_document(list(rows.values()), "build host"), SigningKey.load(keys["ours"])),
    }
    for name, content in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(content))
    trusted = [f"{keys['ours']}.pub"]
    cases = [
        {"name": "unsigned", "path": "unsigned", "trust": [], "cache_dir": None},
        {"name": "unsigned under trust", "path": "unsigned", "trust": trusted, "cache_dir": None},
        {"name": "signed by another key", "path": "theirs", "trust": trusted, "cache_dir": None},
        {"name": "linked out of the cache folder", "path": "ours", "trust": trusted, "cache_dir": str(linked)},
        {"name": "genuine", "path": "genuine", "trust": trusted, "cache_dir": str(packaged / "cache")},
    ]
    cases = [{**c, "path": str(tmp_path / f"{c['path']}.json"), "url": url} for c in cases for url in (False, True)]
    for case in cases:
        case["name"] += " over HTTP" if case["url"] else ""
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    script = tmp_path / "attack.py"
    script.write_text(ATTACK)
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_models["llama"]), str(tmp_path / "cases.json"), str(marker)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    expected = {
        "unsigned": "TrustError: .*guard snapshot not verified",
        "unsigned under trust": "TrustError: .*unsigned, but trusted keys are configured",
        "signed by another key": "TrustError: .*which is not trusted",
        "linked out of the cache folder": "TrustError: .*leads outside the cache folder",
        "genuine": f"primed: {len(BATCHES)} loaded, 0 graphs, 0 cache misses",
    }
    assert len(results) == len(cases) * 3
    for name, (outcome, constructor_ran) in results.items():
        assert not constructor_ran, f"{name}: the planted constructor ran ({outcome})"
        assert re.match(expected[name.split("/")[0].removesuffix(" over HTTP")], outcome), f"{name}: {outcome}"
        assert "\n" not in outcome


def test_constants_are_every_parameter_and_buffer_under_every_name_and_a_missing_one_is_one_line() -> None:
    """A rotary ``inv_freq`` is a non-persistent buffer ``state_dict()`` leaves out; a tied weight has two names."""
    import torch

    from warmcache.artifacts.aoti_export import constant_header
    from warmcache.artifacts.format import named_tensors

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(8, 4)
            self.head = torch.nn.Linear(4, 8, bias=False)
            self.head.weight = self.embed.weight  # tied
            self.register_buffer("inv_freq", torch.ones(2), persistent=False)

    step = Step()
    assert "inv_freq" not in step.state_dict()
    assert {"embed.weight", "head.weight", "inv_freq"} <= set(named_tensors(step))
    assert constant_header(step, ["inv_freq", "head.weight"], {}) == {
        "head.weight": [[8, 4], "torch.float32"],
        "inv_freq": [[2], "torch.float32"],
    }
    with pytest.raises(CacheError) as missing:
        constant_header(step, ["inv_freq", "rotary.inv_freq", "other"], {})
    assert (
        str(missing.value)
        == "aotinductor package: constant other is not a parameter or buffer of the loaded model (nor 1 more)"
    )


@pytest.mark.slow
def test_a_package_that_fails_to_load_leaves_nothing_in_the_temporary_folder(
    packaged: Path, tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C++ loader unpacks into ``$TMPDIR/aotinductor_*`` and removed it only when a load succeeded: a package whose
    ``.so`` does not load (here an empty one: undefined symbols) left the folder behind."""
    from warmcache.artifacts.aoti_loader import load_package
    from warmcache.artifacts.code_check import ModelCodeCheck
    from warmcache.artifacts.route import expected_fingerprint

    (tmp_path / "empty.c").write_text("int nothing(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "empty.so"), str(tmp_path / "empty.c")], check=True)
    row = _rows(packaged)[1]
    broken = _swapped_package(packaged / "cache" / _package(row), tmp_path / "empty.so", tmp_path / "cache")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    model = _model(tiny_models["llama"])
    with pytest.raises(CacheError, match="AOTInductor package does not load") as refused:
        load_package(tmp_path / "cache", broken, expected_fingerprint(row), model, ModelCodeCheck(model))
    assert "\n" not in str(refused.value)
    assert list(temporary.iterdir()) == []


class _LongRope:
    """A step whose forward keeps a tensor it computes as a plain attribute, as transformers' longrope does with
    ``long_inv_freq`` (48 wide, as Phi-3.5's: Inductor inlines a constant of 4 into the code instead of listing it)."""

    WIDTH = 48

    @classmethod
    def module(cls) -> Any:
        import torch

        width = cls.WIDTH

        class Rotary(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("inv_freq", torch.zeros(width), persistent=False)
                self.register_buffer("original_inv_freq", torch.linspace(0.1, 1.0, width), persistent=False)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if getattr(self, "long_inv_freq", None) is None:
                    self.long_inv_freq = 1.0 / (
                        1e4 ** (torch.arange(0, 2 * width, 2, dtype=torch.float32) / (2 * width))
                    )
                self.inv_freq.copy_(torch.where(x.abs().amax() > 1.0, self.long_inv_freq, self.original_inv_freq))
                return x * self.inv_freq

        class Step(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.proj = torch.nn.Linear(width, width)
                self.rotary = Rotary()

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.rotary(self.proj(x))

        return Step().eval()


@pytest.mark.slow
def test_a_carried_tensor_the_model_changes_as_it_decodes_is_refused_and_one_it_derives_is_not() -> None:
    """Both are plain attributes that export carries by value: Phi-3.5's ``long_inv_freq`` is derived once and stays,
    while state kept on a module (RecurrentGemma's ``conv1d_state``) moves at every call, and a package would serve
    every request with warmup's. Warmup tells them apart by one more eager call, and puts the attribute back. A
    tensor literal the forward makes at every call is carried too, held by no module: not state, and no error."""
    from types import SimpleNamespace

    import torch

    from warmcache.artifacts.aoti_export import _constants_as_buffers, refuse_carried_state

    class Stateful(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(_LongRope.WIDTH, _LongRope.WIDTH)
            self.state = torch.zeros(_LongRope.WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.state = self.state + x.mean(0)
            return self.proj(x) + self.state

    class Literal(torch.nn.Module):  # a tensor the forward makes at every call: lifted as a constant no module holds
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(_LongRope.WIDTH, _LongRope.WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) * torch.tensor([2.0] * _LongRope.WIDTH)

    x = torch.randn(2, _LongRope.WIDTH) * 4
    with torch.no_grad():
        literal = Literal().eval()
        program = torch.export.export(literal, (x,), strict=False)
    lifted = _constants_as_buffers(program)
    assert list(lifted) == ["lifted_tensor_0"], lifted
    refuse_carried_state(literal, SimpleNamespace(step=literal, computed=lifted), {"x": x})  # type: ignore[arg-type]
    for step, refused in ((_LongRope.module(), None), (Stateful().eval(), "reads state, a tensor the model keeps")):
        with torch.no_grad():
            step(x)  # warmup's earlier calls: the derived tensor is made, the state has moved
            program = torch.export.export(step, (x,), strict=False)
        computed = _constants_as_buffers(program)
        assert len(computed) == 1, computed
        ((fqn, value),) = computed.items()
        before = value.clone()
        exported = SimpleNamespace(step=step, computed=computed)
        if refused is None:
            refuse_carried_state(step, exported, {"x": x})  # type: ignore[arg-type]
        else:
            with pytest.raises(CacheError, match=refused):
                refuse_carried_state(step, exported, {"x": x})  # type: ignore[arg-type]
        holder, _, name = fqn.rpartition(".")
        assert torch.equal(getattr(step.get_submodule(holder), name), before), fqn  # put back as it was


def test_a_tensor_the_forward_computes_is_carried_by_the_package_under_its_own_name(tmp_path: Path) -> None:
    """Phi-3.5's longrope keeps ``long_inv_freq`` as a plain attribute: exported as a constant, AOTInductor named it
    ``_tensor_constant0`` and no model tensor could be bound to it. Re-declared as a buffer, the package lists it by
    name; its value travels in the header and binds, with the model's weights, to a package that computes what eager
    does.
    """
    import torch

    from warmcache.artifacts.aoti_export import INDUCTOR_CONFIGS, _constants_as_buffers, constant_header
    from warmcache.artifacts.aoti_loader import open_loader
    from warmcache.artifacts.format import decode_tensor, encode_tensor, named_tensors

    step, x = _LongRope.module(), torch.randn(2, _LongRope.WIDTH) * 4
    with torch.no_grad():
        expected = step(x).clone()
        program = torch.export.export(step, (x,), strict=False)
        computed = _constants_as_buffers(program)
        assert set(computed) == {"rotary.long_inv_freq"}
        path = tmp_path / "step.pt2"
        torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=INDUCTOR_CONFIGS)
    listed = open_loader(path).get_constant_fqns()
    assert "rotary.long_inv_freq" in listed and not [n for n in listed if n.startswith("_tensor_constant")], listed
    header = constant_header(step, listed, computed)
    assert "rotary.long_inv_freq" not in header and "proj.weight" in header
    carried = {fqn: decode_tensor(path, fqn, encode_tensor(computed[fqn]), "cpu") for fqn in computed}
    assert torch.equal(carried["rotary.long_inv_freq"], computed["rotary.long_inv_freq"])
    assert "rotary.long_inv_freq" not in named_tensors(
        _LongRope.module()
    )  # a fresh process's model: not before a forward
    own = named_tensors(step)
    bound = {fqn: carried[fqn] if fqn in carried else own[fqn].clone() for fqn in listed}
    loader = open_loader(path)
    loader.load_constants(bound, use_inactive=False, check_full_update=True, user_managed=True)
    (got,) = loader.run([x])
    assert torch.allclose(got, expected), (got, expected)


def test_computed_constants_are_bounded_and_a_malformed_one_is_one_line(tmp_path: Path) -> None:
    import torch

    from warmcache.artifacts.aoti_export import MAX_COMPUTED_CONSTANT_BYTES, constant_header
    from warmcache.artifacts.format import decode_tensor, encode_tensor

    step = torch.nn.Linear(2, 2)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        value = (
            torch.arange(6, dtype=dtype).reshape(2, 3) / 7 if dtype.is_floating_point else torch.arange(6).reshape(2, 3)
        )
        assert torch.equal(decode_tensor(tmp_path, "t", encode_tensor(value), "cpu"), value)
    huge = {"table": torch.zeros(MAX_COMPUTED_CONSTANT_BYTES // 4 + 1)}
    with pytest.raises(
        CacheError, match=r"^aotinductor package: the decode step computes \d+ bytes of tensor constants .*first: table"
    ):
        constant_header(step, ["weight", "table"], huge)
    for broken in (
        ["x"],
        [[2], "torch.float32", "not base64!"],
        [[3], "torch.float32", encode_tensor(torch.zeros(2))[2]],
        [[1], "torch.nothing", ""],
    ):
        with pytest.raises(CacheError) as refused:
            decode_tensor(tmp_path / "p.pt2", "rotary.long_inv_freq", broken, "cpu")
        assert "computed constant rotary.long_inv_freq is malformed" in str(refused.value) and "\n" not in str(
            refused.value
        )
