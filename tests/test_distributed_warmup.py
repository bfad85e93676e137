"""Sharded models warmed under torchrun on CPU (gloo): real ranks, real TP loading, real compiles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from warmcache_testkit.manifests import generate, manifest_toml, model, train

from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry

pytestmark = pytest.mark.slow

TWO_RANKS = manifest_toml(
    model("tp", backend="aot_eager", distributed={"tp_size": 2}, generate=[generate(batch_sizes=[1, 2])]),
    model("fsdp", "{llama}", backend="aot_eager", distributed={"fsdp_size": 2}, train=[train()]),
)

TP_ONE_SHAPE = manifest_toml(
    model("tp", backend="aot_eager", distributed={"tp_size": 2}, generate=[generate(batch_sizes=[2])])
)

MIXED = manifest_toml(
    model("solo", "{llama}", backend="eager", generate=[generate()]),
    model("tp", backend="aot_eager", distributed={"tp_size": 2}, generate=[generate(batch_sizes=[2])], train=[train()]),
)


def _run(command: list[str], url: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WARMCACHE_DB": url, "WARMCACHE_CACHE_DIR": str(cache)}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@dataclass(frozen=True)
class TwoRanks:
    """One ``torchrun --nproc_per_node=2 -m warmcache warmup`` of TWO_RANKS: its manifest, registry, cache and
    result."""

    manifest: Path
    url: str
    cache: Path
    done: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> TwoRanks:
    root = tmp_path_factory.mktemp("two-ranks")
    manifest = root / "manifest.toml"
    manifest.write_text(
        TWO_RANKS.replace("{qwen3}", str(tiny_models["qwen3"])).replace("{llama}", str(tiny_models["llama"]))
    )
    url = f"sqlite:///{root / 'registry.sqlite'}"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "warmcache",
        "warmup",
        str(manifest),
        "--json",
    ]
    return TwoRanks(manifest, url, root / "cache", _run(command, url, root / "cache"))


def test_torchrun_warms_tensor_and_fully_sharded_models(two_ranks: TwoRanks) -> None:
    """``torchrun --nproc_per_node=2 -m warmcache warmup``: TP generate and an FSDP Trainer step, one registry
    writer."""
    manifest, url, done = two_ranks.manifest, two_ranks.url, two_ranks.done
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout)  # rank 0 alone reports: stdout is one JSON document
    assert (summary["compiled"], summary["failed"]) == (3, 0)
    assert all(spec["graphs"] >= 1 for spec in summary["specs"])

    with Registry.open(url) as registry:
        rows = registry.rows()
    assert sorted(
        (r.model_name, r.workload, r.batch_size, r.tp_size, r.fsdp_size, r.status, r.attempts) for r in rows
    ) == [
        ("fsdp", "train", 2, 1, 2, "compiled", 1),
        ("tp", "generate", 1, 2, 1, "compiled", 1),
        ("tp", "generate", 2, 2, 1, "compiled", 1),
    ]
    assert {r.identity for r in rows} == {p.identity for p in plan_manifest(load_manifest(manifest))}


def test_warmup_launches_torchrun_for_sharded_models_and_a_failure_on_the_ranks_fails_the_spec(
    tmp_path: Path, write_manifest
) -> None:
    """One ``warmcache warmup``: the single-process model here, the TP model under a torchrun it starts.

    The Trainer refuses tensor parallelism on CPU (accelerate's MULTI_CPU), so the
    TP training spec fails on every rank: recorded once as failed, the rest goes on.
    """
    manifest = write_manifest(MIXED)
    url = f"sqlite:///{tmp_path / 'registry.sqlite'}"
    done = _run([sys.executable, "-m", "warmcache", "warmup", str(manifest), "--json"], url, tmp_path / "cache")
    assert done.returncode == 1, done.stderr[-4000:]
    summary = json.loads(done.stdout)
    outcomes = {spec["spec"].split()[0]: spec for spec in summary["specs"]}
    assert outcomes["solo/generate"]["status"] == "compiled"
    assert outcomes["tp/generate"]["status"] == "compiled"
    assert outcomes["tp/train"]["status"] == "failed"
    assert outcomes["tp/train"]["error"].startswith(
        "rank 0: loading the model: ValueError: ParallelismConfig is only compatible"
    )

    with Registry.open(url) as registry:
        rows = {(r.model_name, r.workload): r for r in registry.rows()}
    assert (rows["solo", "generate"].tp_size, rows["solo", "generate"].status) == (1, "compiled")
    assert (rows["tp", "generate"].tp_size, rows["tp", "generate"].status, rows["tp", "generate"].attempts) == (
        2,
        "compiled",
        1,
    )
    assert (rows["tp", "train"].status, rows["tp", "train"].attempts) == ("failed", 1)
    assert rows["tp", "train"].error == outcomes["tp/train"]["error"]
    # Rank 0 sends its phases through the torchrun child to this process, which names each line's spec; the other rank
    # sends none.
    lines = done.stderr.splitlines()
    for phase in ("loading the model", "compiling the decode step"):
        assert (
            sum(
                line.startswith(f"{outcomes['tp/generate']['spec']}: {phase}") and " for " not in line for line in lines
            )
            == 1
        ), done.stderr[-4000:]


def test_verify_replays_sharded_specs_under_torchrun(two_ranks: TwoRanks, tmp_path: Path, write_manifest) -> None:
    """A sharded spec is replayed by as many ranks as it was warmed with, not failed for lack of them."""
    assert two_ranks.done.returncode == 0, two_ranks.done.stderr[-4000:]
    manifest = write_manifest(TP_ONE_SHAPE)  # one of the TP shapes the module's torchrun warmup compiled
    shutil.copy(two_ranks.url.removeprefix("sqlite:///"), tmp_path / "registry.sqlite")
    url = f"sqlite:///{tmp_path / 'registry.sqlite'}"
    done = _run([sys.executable, "-m", "warmcache", "verify", str(manifest), "--json"], url, two_ranks.cache)
    assert done.returncode == 0, done.stderr[-4000:]
    (spec,) = json.loads(done.stdout)["specs"]
    # aot_eager keeps no persistent cache: the proof is a replay without error on both ranks.
    assert (spec["verdict"], spec["reason"]) == ("replay-only", "backend keeps no persistent cache")
    assert spec["graphs_traced"] >= 1
    # The replay's rank 0 says its phases (once: the other rank reports nowhere).
    assert sum(line.startswith(f"{spec['spec']}: loading the model") for line in done.stderr.splitlines()) == 1, (
        done.stderr[-4000:]
    )
    with Registry.open(url) as registry:
        (row,) = [r for r in registry.rows(model="tp") if r.batch_size == 2]
    assert (row.tp_size, row.status) == (2, "compiled")
