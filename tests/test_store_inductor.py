"""Two hosts, one store: host A warms up a real Inductor shape and publishes it; hosts B and C,
with empty caches and empty registries, pull it (B from moto's S3 server, C from a file:// store)
and ``warmcache verify`` passes there with zero cache misses and no new cache entries.

One warmup (one shape, ≈30–45 s cold on 2 cores) serves both round trips; every step runs the
CLI in a fresh process, as a deployment pipeline does.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from manifests import generate, manifest_toml, model
from moto_server import DUMMY_CREDENTIALS, create_bucket
from test_bundle_inductor import warmcache

#: The bundle round trip's manifest, cut to one shape.
MANIFEST = manifest_toml(model("tiny-qwen3", backend="inductor", generate=[generate()]), cache={"dir": "{cache}"})


@pytest.fixture(scope="module")
def host_a(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path], s3_endpoint: str) -> dict[str, Any]:
    """Host A: a real Inductor warmup that publishes its shape to S3 as soon as it is compiled."""
    root = tmp_path_factory.mktemp("host-a")
    manifest = root / "manifest.toml"
    manifest.write_text(textwrap.dedent(MANIFEST).replace("{cache}", str(root / "cache")).replace("{qwen3}", str(tiny_models["qwen3"])))
    os.environ.update(DUMMY_CREDENTIALS)  # for boto3 here and in the CLI processes (moto takes any key)
    create_bucket(s3_endpoint, "fleet-cache")
    store = ["--store", "s3://fleet-cache/prod", "--endpoint-url", s3_endpoint]
    db = f"sqlite:///{root / 'a.sqlite'}"
    # Flags, not the environment: a module fixture runs before the per-test isolation of WARMCACHE_*.
    warmed = warmcache("warmup", str(manifest), "--db", db, "--cache-dir", str(root / "cache"), "--push", *store)
    assert warmed["compiled"] == 1 and warmed["ok"] and warmed["push"] == {**warmed["push"], "pushed": 1, "failures": []}, warmed
    return {"manifest": manifest, "db": db, "cache": str(root / "cache"), "s3": store}


def pull_and_verify(host_a: dict[str, Any], store: list[str], host: Path) -> None:
    cache, db = host / "cache", f"sqlite:///{host / 'registry.sqlite'}"
    pulled = warmcache("pull", "--allow-unsigned", str(host_a["manifest"]), "--cache-dir", str(cache), "--db", db, *store)
    assert (pulled["shapes_pulled"], pulled["missing_in_store"], pulled["rows"]["inserted"]) == (1, [], 1), pulled
    verify = warmcache("verify", str(host_a["manifest"]), "--cache-dir", str(cache), "--db", db, ok_codes=(0, 1))
    [spec] = verify["specs"]
    assert (spec["verdict"], spec["cache_misses"], spec["new_entries"]) == ("verified", 0, []), spec
    again = warmcache("pull", "--allow-unsigned", str(host_a["manifest"]), "--cache-dir", str(cache), "--db", db, *store)
    assert (again["shapes_already_present"], again["bytes_downloaded"]) == (1, 0)


@pytest.mark.slow
def test_a_shape_warmed_and_pushed_on_one_host_verifies_after_a_pull_from_s3(host_a: dict[str, Any], tmp_path: Path) -> None:
    pull_and_verify(host_a, host_a["s3"], tmp_path / "host-b")


@pytest.mark.slow
def test_the_same_round_trip_through_a_file_store(host_a: dict[str, Any], tmp_path: Path) -> None:
    store = ["--store", (tmp_path / "nfs-store").as_uri()]
    pushed = warmcache("push", str(host_a["manifest"]), "--db", host_a["db"], "--cache-dir", host_a["cache"], *store)
    assert pushed["shapes"] == 1 and pushed["blobs_uploaded"] > 0
    pull_and_verify(host_a, store, tmp_path / "host-c")
