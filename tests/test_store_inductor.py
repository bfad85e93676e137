"""Two hosts, one store: host A warms up a real Inductor shape and publishes it; hosts B and C,
with empty caches and empty registries, pull it (B from moto's S3 server, C from a file:// store)
and ``warmcache verify`` passes there with zero cache misses and no new cache entries.

Host A is the suite's one real Inductor warmup (conftest's ``inductor_warmup``, which pushed
to S3 as it compiled); its manifest is cut to one shape here. Every step runs the CLI in a
fresh process, as a deployment pipeline does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from warmcache_testkit.inductor_host import InductorWarmup
from warmcache_testkit.inductor_host import warmcache_json as warmcache


@pytest.fixture(scope="module")
def host_a(inductor_warmup: InductorWarmup, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Host A's build seen through a manifest of one of its shapes (batch 1, prompt 8): what B and C pull and verify."""
    warmed = inductor_warmup.report
    assert (
        warmed["compiled"] == 4 and warmed["ok"] and warmed["push"] == {**warmed["push"], "pushed": 4, "failures": []}
    ), warmed
    manifest = inductor_warmup.manifest_for(
        tmp_path_factory.mktemp("host-a") / "manifest.toml", batch_sizes=(1,), prompt_lengths=(8,)
    )
    return {
        "manifest": manifest,
        "db": inductor_warmup.db,
        "cache": str(inductor_warmup.cache),
        "s3": list(inductor_warmup.s3_store),
    }


def pull_and_verify(host_a: dict[str, Any], store: list[str], host: Path) -> None:
    cache, db = host / "cache", f"sqlite:///{host / 'registry.sqlite'}"
    pulled = warmcache(
        "pull", "--allow-unsigned", str(host_a["manifest"]), "--cache-dir", str(cache), "--db", db, *store
    )
    assert (pulled["shapes_pulled"], pulled["missing_in_store"], pulled["rows"]["inserted"]) == (1, [], 1), pulled
    verify = warmcache("verify", str(host_a["manifest"]), "--cache-dir", str(cache), "--db", db, ok_codes=(0, 1))
    [spec] = verify["specs"]
    assert (spec["verdict"], spec["cache_misses"], spec["new_entries"]) == ("verified", 0, []), spec
    again = warmcache(
        "pull", "--allow-unsigned", str(host_a["manifest"]), "--cache-dir", str(cache), "--db", db, *store
    )
    assert (again["shapes_already_present"], again["bytes_downloaded"]) == (1, 0)


@pytest.mark.slow
def test_a_shape_warmed_and_pushed_on_one_host_verifies_after_a_pull_from_s3(
    host_a: dict[str, Any], tmp_path: Path
) -> None:
    pull_and_verify(host_a, host_a["s3"], tmp_path / "host-b")


@pytest.mark.slow
def test_the_same_round_trip_through_a_file_store(host_a: dict[str, Any], tmp_path: Path) -> None:
    store = ["--store", (tmp_path / "nfs-store").as_uri()]
    pushed = warmcache("push", str(host_a["manifest"]), "--db", host_a["db"], "--cache-dir", host_a["cache"], *store)
    assert pushed["shapes"] == 1 and pushed["blobs_uploaded"] > 0
    pull_and_verify(host_a, store, tmp_path / "host-c")
