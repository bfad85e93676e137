"""``GET /v1/guard/{model}`` of an AOTInductor model: a guard built from the signed answer primes the packages with no
graph, and the answer names no path of the serving host.

The registry and cache are the suite's AOTInductor warmup (``conftest.packaged``), served by a real
``warmcache serve`` app on loopback; the guard loads the packages from its own cache folder.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from test_service import wait_ready

from warmcache.runtime.guard import ShapeGuard
from warmcache.service import ServiceConfig
from warmcache.service.server import running_server
from warmcache.settings import RegistryLocation
from warmcache.trust import SigningKey, generate_key


@pytest.mark.slow
def test_a_guard_from_a_signed_service_primes_aotinductor_packages_without_a_graph(
    packaged: Path, tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    generate_key(tmp_path / "key")
    registry = RegistryLocation.parse(f"sqlite:///{packaged}/registry.sqlite")
    with running_server(ServiceConfig(registry, signing_key=SigningKey.load(tmp_path / "key"))) as base:
        wait_ready(base)
        with urllib.request.urlopen(f"{base}/v1/guard/m?workload=generate", timeout=20) as answer:
            served = answer.read().decode()
        records = json.loads(served)["records"]
        assert records and all(r["artifacts"] for r in records), "every row names its package"
        assert str(packaged) not in served and str(tiny_models["llama"]) not in served, "no path of the serving host"
        assert {(r["cache_root"], r["model_path"]) for r in records} == {(None, "")}

        monkeypatch.setenv("WARMCACHE_CACHE_DIR", str(packaged / "cache"))  # this host's copy of the cache
        guard = ShapeGuard.from_url(base, "m", telemetry=False, trust=[str(tmp_path / "key.pub")])
        model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"], dtype=torch.float32).eval()
        report = guard.prime(model)
    assert (report.artifacts_loaded, report.graphs, report.artifact_errors) == (len(records), 0, []), report
