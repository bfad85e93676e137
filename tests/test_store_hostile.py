"""Pulls from hostile servers on loopback (:mod:`hostile_servers`): a trickle cannot hold a pull past ``--timeout``,
and no body is read past its bound (a manifest, a gzip layer, a layer past its declared size, a tar's members, the
pages of a tag list), whatever the registry claims.

The images are real: pushed by warmcache to Debian's docker-registry, copied into the
hostile registry, then served back with one answer changed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_bundle
from test_bundle import Built
from test_store import error_lines, run
from warmcache_testkit.hostile_servers import HostileRegistry, HostileS3, Reply
from warmcache_testkit.moto_server import DUMMY_CREDENTIALS
from warmcache_testkit.oci_registry import RunningRegistry

built = test_bundle.built
#: The ``--timeout`` of the trickle tests; a pull must end within it plus this much.
TIMEOUT_S, GRACE_S = 2.0, 5.0


@pytest.fixture
def hostile() -> Iterator[HostileRegistry]:
    with HostileRegistry().running() as server:
        assert isinstance(server, HostileRegistry)
        yield server


@pytest.fixture
def pushed(built: Built, registry_host: RunningRegistry, hostile: HostileRegistry) -> tuple[str, dict]:
    """A real tag of the two built shapes, pushed to docker-registry and copied into the hostile registry;
    ``(repository, manifest)``."""
    repository = f"team/h-{uuid.uuid4().hex[:8]}"
    code, _, err = run(
        "push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url,
        "--store", registry_host.url(repository, "prod"),
    )  # fmt: skip
    assert code == 0, err
    return repository, hostile.copy_tag(registry_host.host, repository, "prod")


def pull(built: Built, url: str, tmp_path: Path, *extra: str) -> tuple[int, str, float]:
    started = time.monotonic()
    code, _, err = run(
        "pull", str(built.manifest), "--cache-dir", str(tmp_path / "b"), "--db", f"sqlite:///{tmp_path / 'b.sqlite'}",
        "--allow-unsigned", "--store", url, *extra,
    )  # fmt: skip
    return code, err, time.monotonic() - started


def test_a_registry_trickling_a_layer_ends_the_pull_within_its_timeout(
    built: Built, hostile: HostileRegistry, pushed: tuple[str, dict], tmp_path: Path
) -> None:
    repository, manifest = pushed
    layer = manifest["layers"][0]["digest"]
    hostile.replies[hostile.blob_path(repository, layer)] = Reply(hostile.blobs[layer], trickle=0.2)
    code, err, elapsed = pull(built, hostile.url(repository, "prod"), tmp_path, "--timeout", f"{TIMEOUT_S:g}s")
    assert code == 6 and len(error_lines(err)) == 1 and "--timeout" in err, err
    assert elapsed < TIMEOUT_S + GRACE_S, f"held {elapsed:.1f} s by a trickle"


def test_an_s3_endpoint_trickling_a_blob_ends_the_pull_within_its_timeout(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    folder = tmp_path / "store"
    code, _, err = run(
        "push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, "--store", folder.as_uri()
    )
    assert code == 0, err
    with HostileS3("bucket", folder, trickle=lambda key: key.startswith("blobs/")).running() as s3:
        code, err, elapsed = pull(
            built, "s3://bucket", tmp_path, "--endpoint-url", f"http://{s3.host}", "--timeout", f"{TIMEOUT_S:g}s"
        )
    assert code == 6 and len(error_lines(err)) == 1 and "the command's deadline" in err, err
    assert elapsed < TIMEOUT_S + GRACE_S, f"held {elapsed:.1f} s by a trickle"
    kept = list((tmp_path / "b").rglob("*"))  # only checked blobs (the empty one needs no bytes), for a resume
    assert all(p.is_dir() or hashlib.sha256(p.read_bytes()).hexdigest() == p.name for p in kept), kept


# ------------------------------------------------------------ bodies bounded before they are read


def peak_bytes_of(call) -> tuple[object, int]:  # type: ignore[no-untyped-def]
    """``call()``'s result and the most memory Python held meanwhile (every thread)."""
    tracemalloc.start()
    try:
        return call(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "undeclared"])
def test_a_huge_manifest_is_refused_before_it_is_read(hostile: HostileRegistry, chunked: bool) -> None:
    path = "/v2/team/big/manifests/prod"
    hostile.put_manifest("team/big", "prod", b"{}")  # listed as a tag; its answer is the one below
    hostile.replies[path] = Reply(b"{" + b" " * (1 << 20), repeat=200, chunked=chunked)
    (code, _, err), peak = peak_bytes_of(lambda: run("store", "ls", "--store", hostile.url("team/big", "prod")))
    assert peak < 32 << 20 and hostile.sent_bytes < 64 << 20, (peak, hostile.sent_bytes)
    assert code == 6 and len(error_lines(err)) == 1 and "refused" in err, err


def image_with_metadata_layer(hostile: HostileRegistry, repository: str, layer: bytes, media_type: str) -> None:
    """A tag whose only (metadata) layer is ``layer``, as ``media_type``; its config names the layer's diff_id."""
    stored = hostile.put_blob(layer)
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": ["sha256:" + "0" * 64]}}).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **hostile.put_blob(config)},
        "layers": [{"mediaType": media_type, **stored}],
    }
    hostile.put_manifest(repository, "prod", json.dumps(manifest).encode())


def test_a_gzip_bomb_as_the_metadata_layer_is_refused_while_it_inflates(hostile: HostileRegistry) -> None:
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb", mtime=0) as out:
        for _ in range(1024):
            out.write(bytes(1 << 20))  # 1 GiB of zeros: about 1 MB of gzip
    image_with_metadata_layer(hostile, "team/bomb", bomb.getvalue(), "application/vnd.oci.image.layer.v1.tar+gzip")
    (code, _, err), peak = peak_bytes_of(lambda: run("store", "ls", "--store", hostile.url("team/bomb", "prod")))
    assert peak < 256 << 20, peak
    assert code == 5 and len(error_lines(err)) == 1 and "inflates past" in err, err


def test_a_layer_is_cut_at_its_declared_size(
    built: Built, hostile: HostileRegistry, pushed: tuple[str, dict], tmp_path: Path
) -> None:
    repository, manifest = pushed
    layer = manifest["layers"][0]["digest"]
    for chunked in (False, True):  # the length announced, then not
        hostile.sent_bytes = 0
        hostile.replies[hostile.blob_path(repository, layer)] = Reply(bytes(1 << 20), repeat=1024, chunked=chunked)
        code, err, _ = pull(built, hostile.url(repository, "prod"), tmp_path)
        assert hostile.sent_bytes < 64 << 20, f"{hostile.sent_bytes} bytes sent for a layer of {manifest['layers'][0]}"
        assert code == 6 and len(error_lines(err)) == 1 and "declared" in err, err


def replace_layer(hostile: HostileRegistry, repository: str, manifest: dict, index: int, tar: bytes) -> None:
    """Serve ``tar`` as the image's data layer ``index``: its descriptor, the config's diff_ids and ``index.json``'s
    layer map all say so (none of them is signed; the shape indexes are, and stay as pushed)."""
    old = manifest["layers"][index]["digest"]
    new = hostile.put_blob(tar)
    config = json.loads(hostile.blobs[manifest["config"]["digest"]])
    config["rootfs"]["diff_ids"] = [new["digest"] if d == old else d for d in config["rootfs"]["diff_ids"]]
    metadata = tarfile.open(fileobj=io.BytesIO(hostile.blobs[manifest["layers"][-1]["digest"]]))
    members = {m.name: metadata.extractfile(m).read() for m in metadata if m.isreg()}  # type: ignore[union-attr]
    document = json.loads(members[".warmcache-image/index.json"])
    for entry in document["layers"]:
        if entry["digest"] == old:
            entry.update(new)
    members[".warmcache-image/index.json"] = json.dumps(document).encode()
    rebuilt = io.BytesIO()
    with tarfile.open(fileobj=rebuilt, mode="w") as out:
        for name, data in members.items():
            out.addfile(_member(name, len(data)), io.BytesIO(data))
    metadata_layer = hostile.put_blob(rebuilt.getvalue())
    config["rootfs"]["diff_ids"][-1] = metadata_layer["digest"]
    layers = [dict(d) for d in manifest["layers"]]
    layers[index].update(new)
    layers[-1].update(metadata_layer)
    changed = {**manifest, "config": {**manifest["config"], **hostile.put_blob(json.dumps(config).encode())}}
    hostile.put_manifest(repository, "prod", json.dumps({**changed, "layers": layers}).encode())


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def test_a_layer_of_many_tar_members_is_refused_past_what_its_index_lists(
    built: Built, hostile: HostileRegistry, pushed: tuple[str, dict], tmp_path: Path
) -> None:
    repository, manifest = pushed
    crowded = io.BytesIO()
    with tarfile.open(fileobj=crowded, mode="w") as out:
        for number in range(100_000):
            out.addfile(_member(f"junk/{number}", 0))
    replace_layer(hostile, repository, manifest, 0, crowded.getvalue())
    (result), peak = peak_bytes_of(lambda: pull(built, hostile.url(repository, "prod"), tmp_path))
    code, err, _ = result  # type: ignore[misc]
    assert peak < 32 << 20, peak
    assert code == 5 and len(error_lines(err)) == 1 and "members its index lists" in err, err


def test_endless_tag_pages_are_refused_at_the_page_cap_not_at_the_deadline(hostile: HostileRegistry) -> None:
    path = "/v2/team/pages/tags/list"
    page = json.dumps({"name": "team/pages", "tags": ["a"]}).encode()
    hostile.replies[path] = Reply(page, headers={"Link": f'<{path}?n=1000&last=a>; rel="next"'})
    started = time.monotonic()
    code, _, err = run("store", "ls", "--store", hostile.url("team/pages", "prod"), "--timeout", "60s")
    assert code == 6 and len(error_lines(err)) == 1 and "past 100 pages" in err, err
    assert time.monotonic() - started < 30


def test_a_deadline_spent_mid_listing_names_the_deadline_not_zero_seconds(hostile: HostileRegistry) -> None:
    path = "/v2/team/pages/tags/list"
    page = json.dumps({"name": "team/pages", "tags": ["a"]}).encode()
    hostile.replies[path] = Reply(page, headers={"Link": f'<{path}?n=1000>; rel="next"'}, trickle=0.05)
    code, _, err = run("store", "ls", "--store", hostile.url("team/pages", "prod"), "--timeout", "1s")
    (line,) = error_lines(err)
    assert code == 6 and "the command's deadline of 1 s passed during listing tags" in line and " 0 s" not in line, err


def test_a_blob_redirected_to_another_loopback_port_is_refused(
    built: Built, hostile: HostileRegistry, pushed: tuple[str, dict], tmp_path: Path
) -> None:
    repository, manifest = pushed
    layer = manifest["layers"][0]["digest"]
    with HostileRegistry().running() as elsewhere:  # serves the very bytes: only the address is wrong
        assert isinstance(elsewhere, HostileRegistry)
        elsewhere.blobs = dict(hostile.blobs)
        target = f"http://{elsewhere.host}{hostile.blob_path(repository, layer)}"
        hostile.replies[hostile.blob_path(repository, layer)] = Reply(status=307, headers={"Location": target})
        code, err, _ = pull(built, hostile.url(repository, "prod"), tmp_path)
        assert not elsewhere.seen, "the redirect was followed"
    (line,) = error_lines(err)
    assert code == 6 and f"redirects a read to http://{elsewhere.host}" in line, err


def test_a_token_realm_on_another_host_over_plain_http_never_receives_the_credentials(
    built: Built, hostile: HostileRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64

    with HostileRegistry().running() as realm:
        challenge = {"WWW-Authenticate": f'Bearer realm="http://{realm.host}/token",service="registry"'}
        hostile.server.route = lambda *_: Reply(b"{}", 401, challenge)
        auth = base64.b64encode(b"ci:s3cret-password").decode()
        (tmp_path / "config.json").write_text(json.dumps({"auths": {hostile.host: {"auth": auth}}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
        code, err, _ = pull(built, hostile.url("team/private", "prod"), tmp_path)
        assert not realm.seen, "the token service on another host was asked, with the credentials"
    (line,) = error_lines(err)
    assert code == 6 and f"token service on http://{realm.host} over plain HTTP" in line, err
