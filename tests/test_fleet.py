"""A fleet: several warmup processes, one PostgreSQL registry, one shared cache folder.

Real processes (``python -m warmcache warmup``), a real PostgreSQL server and real
compiles (aot_eager): the claims' ``SELECT … FOR UPDATE SKIP LOCKED`` and leases
are what keeps the processes from compiling a spec twice or losing one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry

MANIFEST = manifest_toml(
    model("q", backend="aot_eager", generate=[generate(batch_sizes=[1, 2, 3, 4])]),
    model("l", "{llama}", backend="eager", generate=[generate(batch_sizes=[1, 2, 3, 4])]),
)


def _warmup(manifest: Path, url: str, cache: Path, *extra: str) -> subprocess.Popen[str]:
    # Processes sharing a host split its cores, as torchrun does; oversubscribed torch threads crawl.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "warmcache",
        "warmup",
        str(manifest),
        "--db",
        url,
        "--cache-dir",
        str(cache),
        "--json",
        *extra,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(process: subprocess.Popen[str], timeout: float = 240) -> dict:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"warmup exited {process.returncode}: {err[-3000:]}"
    return json.loads(out)


def _wait_for_claim(url: str, worker: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    with Registry.open(url) as registry:
        while time.monotonic() < deadline:
            held = [r for r in registry.rows(statuses=["compiling"]) if r.claimed_by == worker]
            if held:
                return held[0].identity
            time.sleep(0.05)
    raise AssertionError(f"{worker} claimed nothing within {timeout}s")


@pytest.mark.slow
def test_four_processes_compile_every_spec_once_and_take_over_a_killed_ones_spec(
    postgres_url: str, write_manifest, tmp_path: Path
) -> None:
    """4 processes, one SIGKILLed mid-spec, none of the others errs.

    Between them the 3 survivors compile every spec exactly once, the dead
    process's spec included once its 3 s lease runs out.
    """
    manifest = write_manifest(MANIFEST)
    planned = plan_manifest(load_manifest(manifest))
    cache = tmp_path / "shared-cache"
    lease = "3"

    processes = [_warmup(manifest, postgres_url, cache, "--lease", lease) for _ in range(4)]
    doomed, survivors = processes[0], processes[1:]
    orphan = _wait_for_claim(postgres_url, f"{socket.gethostname()}:{doomed.pid}")
    doomed.send_signal(signal.SIGKILL)  # mid-spec: the claim is held and no result was recorded
    doomed.communicate(timeout=30)
    summaries = [_finish(p) for p in survivors]  # they wait for the dead worker's lease to run out

    compiled_by = Counter(spec["identity"] for s in summaries for spec in s["specs"] if spec["status"] == "compiled")
    assert sorted(compiled_by) == sorted(p.identity for p in planned)
    assert set(compiled_by.values()) == {1}, "a spec was compiled by two processes"
    assert all(s["failed"] == 0 and s["lost"] == 0 for s in summaries)
    assert sum(1 for s in summaries if s["compiled"]) >= 2, "the work was not shared between processes"
    with Registry.open(postgres_url) as registry:
        rows = {r.identity: r for r in registry.rows(identities=[p.identity for p in planned])}
    assert all(r.status == "compiled" and r.claimed_by is None for r in rows.values())
    assert rows[orphan].attempts == 2, "the dead worker's spec was not claimed again"
    assert all(r.attempts == 1 for identity, r in rows.items() if identity != orphan)
