"""The issue's "done when": AOTInductor packages through a registry, and a pod that starts from the tag mounted
read-only.

Host A is the suite's AOTInductor warmup (``conftest.packaged``: warmup and verify
with ``precompile = "aotinductor"``). It pushes, signed, to the session's registry. Host B,
with an empty cache and no registry database, pulls by manifest and ``warmcache verify``
passes with zero compiles. A "pod" copies the tag with skopeo into an OCI layout and
unpacks its layers in order into one folder, as a container runtime does for an image
volume; a fresh process then serves guarded requests from that folder bind-mounted
read-only (``unshare --mount``: root ignores file modes, a read-only mount it cannot),
through the packages, with no compile and nothing written under the mount. The same
mount is refused, one line, under another key and under another toolchain.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import textwrap
import uuid
from pathlib import Path

import pytest
from warmcache_testkit.inductor_host import warmcache_json as warmcache
from warmcache_testkit.oci_registry import RunningRegistry, oci_registry, skopeo_copy

from warmcache.trust import generate_key

#: A production process: the guard from the mounted tag (a snapshot folder), prime, ragged requests, no compile.
SERVE = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from transformers import AutoModelForCausalLM
    from warmcache.runtime.guard import ShapeGuard

    mount, model_path, key = sys.argv[1:4]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    guard = ShapeGuard.from_snapshot(mount, "m", trust=[key], telemetry_url=None)
    report = guard.prime(model)
    same = []
    for batch, lengths in ((1, [5]), (3, [8, 3, 6]), (4, [2, 8, 7, 4])):
        ids = torch.randint(5, 300, (batch, max(lengths)), generator=torch.Generator().manual_seed(batch))
        mask = torch.zeros_like(ids)
        for row, length in enumerate(lengths):
            mask[row, -length:] = 1
            ids[row, :-length] = 0
        out = guard.generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4)
        eager = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4,
            do_sample=False, disable_compile=True, pad_token_id=0,
        )
        same.append(out.tolist() == eager.tolist())
    from torch._dynamo.utils import counters
    compiler = [m for m in ("torch._inductor.compile_fx", "torch._inductor.codecache") if m in sys.modules]
    graphs = int(counters["stats"]["unique_graphs"])
    loaded = report.artifacts_loaded
    print(json.dumps({"artifacts_loaded": loaded, "graphs": graphs, "same": same, "compiler": compiler}))
    """
)


def tree(root: Path) -> dict[str, tuple[int, float, str]]:
    return {
        p.relative_to(root).as_posix(): (
            p.stat().st_size,
            p.stat().st_mtime,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def unpack_like_a_runtime(layout: Path, tag: str, into: Path) -> None:
    """Apply the image's layers in order over one folder (an OCI layout written by skopeo)."""
    index = json.loads((layout / "index.json").read_text())
    (manifest,) = [
        m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag
    ]
    blob = lambda digest: layout / "blobs" / "sha256" / digest.split(":", 1)[1]  # noqa: E731
    for layer in json.loads(blob(manifest["digest"]).read_text())["layers"]:
        with tarfile.open(blob(layer["digest"]), "r:*") as tar:
            tar.extractall(into, filter="data")


def serve_read_only(
    mount: Path, model: Path, key: Path, tmp_path: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    python = f"{sys.executable} {script} {mount} {model} {key}"
    command = f"mount --bind {mount} {mount} && mount -o remount,bind,ro {mount} && exec {python}"
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", command], capture_output=True, text=True, timeout=300, env={**_env(), **env}
    )


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("WARMCACHE_")}


@pytest.mark.slow
def test_packages_travel_through_a_registry_and_serve_from_a_read_only_mount(
    packaged: Path, registry_host: RunningRegistry, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0
    ):
        pytest.skip("unshare --mount is not permitted here: a read-only bind mount needs it")
    generate_key(tmp_path / "build-key")
    generate_key(tmp_path / "other-key")
    manifest, key, pub = packaged / "manifest.toml", tmp_path / "build-key", tmp_path / "build-key.pub"
    repository = f"serving/tiny-llama-{uuid.uuid4().hex[:6]}"
    store = registry_host.url(repository, "v1")
    pushed = warmcache("push", str(manifest), "--sign", str(key), "--store", store)
    assert pushed["shapes"] == 2, pushed

    docker = lambda url: "docker://" + url.split("://", 1)[1]  # noqa: E731
    with oci_registry() as mirrors:  # a mirror on another host, under the name the tag is signed for
        mirror = mirrors.url(repository, "v1")
        skopeo_copy(store, mirror)
        for name, source in (("host-b", store), ("host-c", mirror)):  # host C pulls the skopeo copy
            cache, db = tmp_path / name / "cache", f"sqlite:///{tmp_path / name / 'registry.sqlite'}"
            pulled = warmcache(
                "pull", str(manifest), "--trust", str(pub), "--cache-dir", str(cache), "--db", db, "--store", source
            )
            assert (pulled["shapes_pulled"], pulled["missing_in_store"], pulled["signatures_checked"]) == (
                2,
                [],
                True,
            ), pulled
            verified = warmcache("verify", str(manifest), "--cache-dir", str(cache), "--db", db)
            assert [s["verdict"] for s in verified["specs"]] == ["verified", "verified"], verified
            assert all(s["cache_misses"] == 0 and s["new_entries"] == [] for s in verified["specs"]), verified

    layout = tmp_path / "layout"
    done = subprocess.run(
        ["skopeo", "copy", "--src-tls-verify=false", docker(store), f"oci:{layout}:v1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    mount = tmp_path / "pod" / "cache"
    unpack_like_a_runtime(layout, "v1", mount)
    before = tree(mount)
    served = serve_read_only(mount, tiny_models["llama"], pub, tmp_path)
    assert served.returncode == 0, served.stderr[-3000:]
    result = json.loads(served.stdout.strip().splitlines()[-1])
    assert result == {"artifacts_loaded": 2, "graphs": 0, "same": [True, True, True], "compiler": []}, result
    assert tree(mount) == before, "nothing written under the mount"

    for env, expected in (({"WARMCACHE_UNUSED": ""}, "not trusted"), ({"TORCHINDUCTOR_FREEZING": "1"}, "stale")):
        key_file = tmp_path / "other-key.pub" if expected == "not trusted" else pub
        refused = serve_read_only(mount, tiny_models["llama"], key_file, tmp_path, **env)
        last = refused.stderr.strip().splitlines()[-1]
        assert refused.returncode != 0 and expected in last and str(mount) in last, refused.stderr[-2000:]
