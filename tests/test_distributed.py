"""torchrun detection, relaunch and the rank coordination a sharded warmup relies on."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.manifest import load_manifest
from warmcache.warmup import distributed, sharding

MANIFEST = manifest_toml(
    model("single", backend="eager", generate=[generate()]),
    model("sharded", backend="eager", distributed={"tp_size": 2}, generate=[generate()]),
)


def test_in_torchrun_needs_all_three_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in distributed.TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    assert not distributed.in_torchrun() and distributed.is_registry_writer()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not distributed.in_torchrun()
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.in_torchrun()
    assert (distributed.rank(), distributed.world_size(), distributed.is_registry_writer()) == (1, 2, False)


def test_a_rank_outside_torchrun_still_writes_and_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Kubeflow PyTorchJob pod sets RANK and WORLD_SIZE, not LOCAL_RANK: no process group, so this process speaks
    for itself."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert not distributed.in_torchrun() and distributed.is_registry_writer()


def test_torchrun_command_reruns_warmcache_on_a_free_port() -> None:
    command = distributed.torchrun_command(["warmup", "m.toml", "--model", "x"], 4)
    assert command == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=4",
        "-m",
        "warmcache",
        "warmup",
        "m.toml",
        "--model",
        "x",
    ]


def test_sharded_models_load_with_their_distributed_config(write_manifest) -> None:
    manifest = load_manifest(write_manifest(MANIFEST))
    single, sharded = manifest.model("single"), manifest.model("sharded")
    assert sharding.distributed_config(single) is None
    assert sharding.sharded_load_kwargs(single, {"device_map": "cuda"}) == {"device_map": "cuda"}
    kwargs = sharding.sharded_load_kwargs(sharded, {"device_map": "cuda", "revision": None})
    assert set(kwargs) == {"distributed_config", "revision"}
    config = kwargs["distributed_config"]
    assert (config.tp_size, config.fsdp_size) == (2, 1)


_PROBE = """
import json, sys
from warmcache.warmup import distributed

distributed.init_process_group("cpu")
me = distributed.rank()
claimed = distributed.broadcast_from_writer("identity-from-rank-0" if me == 0 else f"ignored-{me}")
all_ok = distributed.agree_on_failure(None)
one_failed = distributed.agree_on_failure("RuntimeError: shard too small" if me == 1 else None)
done = distributed.broadcast_from_writer(None)
# One file per rank: two ranks printing at once can interleave on one stdout line.
with open(f"{sys.argv[1]}/rank-{me}.json", "w") as out:
    json.dump({"rank": me, "claimed": claimed, "all_ok": all_ok, "one_failed": one_failed, "done": done,
               "writer": distributed.is_registry_writer()}, out)
distributed.shutdown()
"""


def test_ranks_share_rank0_claims_and_fail_together(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(_PROBE))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(probe),
        str(tmp_path),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["claimed"] == "identity-from-rank-0"
        assert r["all_ok"] is None
        assert r["one_failed"] == "rank 1: RuntimeError: shard too small"
        assert r["done"] is None
    assert [r["writer"] for r in results] == [True, False]


_WAIT_PROBE = """
import datetime as dt, json, sys, time
from types import SimpleNamespace
from warmcache.warmup import claims, distributed

# Collectives time out after 4 s here, yet rank 0 waits about 8 s for a spec "another host" holds.
distributed.COLLECTIVE_TIMEOUT = dt.timedelta(seconds=4)
distributed.init_process_group("cpu")
me = distributed.rank()


class Elsewhere:
    # Nothing to claim; the one spec is compiling on another host for 16 polls, then compiled.
    polls = 0

    def claim_batch(self, identities, worker, lease_seconds, count):
        return []

    def unfinished(self, identities):
        self.polls += 1
        return set(identities) if self.polls <= 16 else set()

    def drop_connections(self):
        pass


class NoWork:
    ran = []

    def run(self, planned):
        self.ran.append(planned.identity)


start = time.monotonic()
if distributed.is_registry_writer():
    held = [SimpleNamespace(identity="held-elsewhere")]
    claims.claim_loop(Elsewhere(), None, held, 1.5, print, distributed.coordination())
    distributed.broadcast_from_writer(None)
else:
    distributed.follow_writer(NoWork(), [])
with open(f"{sys.argv[1]}/rank-{me}.json", "w") as out:
    json.dump({"rank": me, "seconds": time.monotonic() - start, "ran": NoWork.ran}, out)
distributed.shutdown()
"""


def test_followers_outlast_the_collective_timeout_while_rank0_waits_for_other_hosts(tmp_path: Path) -> None:
    """Rank 0 waiting for specs held elsewhere broadcasts each poll, so no collective outlasts one poll.

    Before, the followers sat in one broadcast for the whole wait (an hour-long
    Neuron compile on another host): it timed out and torchrun failed the group.
    """
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(_WAIT_PROBE))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(probe),
        str(tmp_path),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["seconds"] > 4 for r in results)  # the wait outlasted the probe's 4 s collective timeout
    assert results[1]["ran"] == []
