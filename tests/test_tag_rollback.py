"""Signed ``oci://`` tags cannot be rolled back or renamed: each push signs its repository, tag and version
(``.warmcache-image/tag.json``), and a pull with trusted keys refuses an older version than this host pulled before,
or than the deployment pins, and a tag signed for another name.

Against Debian's docker-registry on loopback: a tag pushed twice, then its first manifest
put back under the tag, as anyone with write access to the registry (and no key) can.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import test_bundle
from oci_registry import RunningRegistry, oci_registry, skopeo_copy
from test_bundle import Built
from test_store import error_lines, run

from warmcache.store.oci.store import OciStore
from warmcache.trust import generate_key

built = test_bundle.built


def push(built: Built, url: str, key: Path, *extra: str) -> str:
    """Push signed; the tag's manifest digest."""
    code, _, err = run(
        "push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, "--store", url,
        "--sign", str(key), *extra,
    )  # fmt: skip
    assert code == 0, err
    found = OciStore.open(url).client.manifest(url.rsplit(":", 1)[1])
    assert found is not None
    return found[0]


def pull(built: Built, url: str, key: Path, host: Path, *extra: str) -> tuple[int, dict | None, str]:
    return run(
        "pull", str(built.manifest), "--cache-dir", str(host / "cache"), "--db", f"sqlite:///{host / 'r.sqlite'}",
        "--trust", f"{key}.pub", "--store", url, *extra,
    )  # fmt: skip


@pytest.fixture
def two_pushes(built: Built, registry_host: RunningRegistry, tmp_path: Path) -> tuple[str, str, str, Path]:
    """``(url, first digest, second digest, key)``: one tag pushed, its first entry changed, pushed again."""
    generate_key(tmp_path / "key")
    url = registry_host.url(f"team/r-{uuid.uuid4().hex[:8]}", "prod")
    first = push(built, url, tmp_path / "key")
    neff = built.root / built.entries[0] / "model.neff"
    neff.write_bytes(b"recompiled" + neff.read_bytes())
    return url, first, push(built, url, tmp_path / "key"), tmp_path / "key"


def retag(url: str, digest: str) -> None:
    """Put the manifest ``digest`` back under the URL's tag: what a registry writer without the key can do."""
    store = OciStore.open(url)
    found = store.client.manifest(digest)
    assert found is not None
    store.client.put_manifest(store.reference.tag, found[1])


def test_a_tag_rolled_back_to_an_older_signed_push_is_refused(
    built: Built, two_pushes: tuple[str, str, str, Path], tmp_path: Path
) -> None:
    url, first, second, key = two_pushes
    code, pulled, err = pull(built, url, key, tmp_path / "a")
    assert code == 1 and pulled is not None and pulled["shapes_pulled"] == 2, err
    retag(url, first)
    code, _, err = pull(built, url, key, tmp_path / "b")  # a fresh cache on the same host
    (line,) = error_lines(err)
    assert code == 5 and "version 1" in line and "older than version 2" in line and "rolled-back" in line, err
    assert first[:19] in line and second[:19] in line and not (tmp_path / "b").exists()
    memory = json.loads((tmp_path / "xdg-state" / "warmcache" / "oci-tags.json").read_text())
    assert memory["tags"][url]["version"] == 2 and memory["tags"][url]["digest"] == second


def test_without_a_writable_state_dir_a_pinned_minimum_is_the_floor(
    built: Built, two_pushes: tuple[str, str, str, Path], tmp_path: Path
) -> None:
    url, first, _, key = two_pushes
    retag(url, first)
    read_only = ["--state-dir", "/dev/null/warmcache"]  # cannot be created, as on a read-only root file system
    code, _, err = pull(built, url, key, tmp_path / "a", *read_only)
    (line,) = error_lines(err)
    assert code == 2 and "cannot remember" in line and "--state-dir" in line and "--min-tag-version" in line, err
    code, _, err = pull(built, url, key, tmp_path / "a", *read_only, "--min-tag-version", "2")
    (line,) = error_lines(err)
    assert code == 5 and "older than version 2, the least the deployment accepts (--min-tag-version)" in line, err
    code, pulled, err = pull(built, url, key, tmp_path / "a", *read_only, "--min-tag-version", "1")
    assert code == 1 and pulled is not None and pulled["shapes_pulled"] == 2, err


def test_a_signed_tag_copied_under_another_name_is_refused_and_a_mirror_of_the_same_name_pulls(
    built: Built, registry_host: RunningRegistry, tmp_path: Path
) -> None:
    generate_key(tmp_path / "key")
    repository = f"team/src-{uuid.uuid4().hex[:8]}"
    push(built, registry_host.url(repository, "prod"), tmp_path / "key")
    with oci_registry() as mirror:
        for target, expected in ((f"{repository}:prod", 1), (f"{repository}:canary", 5), ("other/name:prod", 5)):
            skopeo_copy(registry_host.url(repository, "prod"), f"oci+http://{mirror.host}/{target}")
            code, _, err = pull(built, f"oci+http://{mirror.host}/{target}", tmp_path / "key", tmp_path / target)
            assert code == expected, (target, err)
            if expected == 5:
                (line,) = error_lines(err)
                assert f"signed for '{repository}:prod', not {target}" in line, err


def test_an_expired_signed_tag_is_refused_naming_tag_and_date_and_a_push_renews_it(
    built: Built, registry_host: RunningRegistry, tmp_path: Path
) -> None:
    """A registry that keeps serving the last push it had (hiding newer ones: a freeze) is caught when it expires."""
    generate_key(tmp_path / "key")
    url = registry_host.url(f"team/x-{uuid.uuid4().hex[:8]}", "prod")
    first = push(built, url, tmp_path / "key")
    document = OciStore.open(url).image().tag_document
    assert document is not None and document["expires"] - document["pushed_at"] == 30 * 86400  # the default
    code, _, err = run("push", str(built.manifest), "--db", built.url, "--store", url, "--expires", "1d")
    assert code == 2 and "only a signed push (--sign)" in err, err
    second = push(built, url, tmp_path / "key", "--expires", "3s")  # nothing changed, but a shorter validity: renewed
    document = OciStore.open(url).image().tag_document
    assert second != first and document is not None and document["version"] == 2
    code, pulled, err = pull(built, url, tmp_path / "key", tmp_path / "a")
    assert code == 1 and pulled is not None and pulled["shapes_pulled"] == 2, err
    time.sleep(max(0.0, document["expires"] - time.time()) + 0.2)
    code, _, err = pull(built, url, tmp_path / "key", tmp_path / "b")
    (line,) = error_lines(err)
    expired = time.strftime("%Y-%m-%d", time.gmtime(document["expires"]))
    assert code == 5 and f"{url}: signed tag version 2" in line and f"expired {expired}" in line, err
    assert not (tmp_path / "b").exists()
    push(built, url, tmp_path / "key")  # past half its validity: a push that changes nothing renews it
    code, pulled, err = pull(built, url, tmp_path / "key", tmp_path / "c")
    assert code == 1 and pulled is not None and pulled["shapes_pulled"] == 2, err
