"""push/pull/store over a real OCI registry (Debian's docker-registry, CNCF distribution 2.8) on loopback.

The same hand-built Neuron caches as the S3 and file store tests (``test_bundle.built``):
round trip host A → registry → host B and the image's own layout, a tampered layer
refused with nothing left behind, a tag re-pushed after a change, concurrent pushes to
one tag, ``gc`` deleting only what no tag references, htpasswd basic auth through
``$DOCKER_CONFIG``, skopeo copying the tag between repositories, and a registry that is
down or stalls ending within the command's deadline in one line.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import test_bundle
from test_bundle import Built, files_under, rows
from test_store import error_lines, run
from warmcache_testkit.oci_registry import RunningRegistry

#: The build machine of the bundle tests: two compiled Neuron shapes, one declared but not compiled.
built = test_bundle.built


@pytest.fixture
def tag(registry_host: RunningRegistry) -> list[str]:
    """CLI arguments naming a fresh repository's tag on the session's registry."""
    return ["--store", registry_host.url(f"team/warm-{uuid.uuid4().hex[:8]}", "prod")]


def push(built: Built, store: list[str], *extra: str) -> dict:
    code, data, err = run(
        "push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, *store, *extra
    )
    assert code == 0 and data is not None, err
    return data


def pull(built: Built, store: list[str], cache: Path, db: str, *extra: str) -> tuple[int, dict | None, str]:
    return run("pull", str(built.manifest), "--cache-dir", str(cache), "--db", db, "--allow-unsigned", *store, *extra)


def test_push_then_pull_round_trips_and_a_second_push_writes_nothing(
    built: Built, tag: list[str], tmp_path: Path
) -> None:
    first = push(built, tag)
    assert (first["shapes"], first["indexes_written"], first["declared_but_not_compiled"]) == (2, 2, 1), first
    again = push(built, tag)
    assert (again["indexes_written"], again["indexes_unchanged"], again["blobs_uploaded"]) == (0, 2, 0), again

    cache, db = tmp_path / "host-b-cache", f"sqlite:///{tmp_path / 'host-b.sqlite'}"
    code, pulled, err = pull(built, tag, cache, db)
    assert code == 1 and pulled is not None, err  # the third declared shape was never compiled
    assert pulled["missing_in_store"] == ["neuron-m/generate float32 max_cache_len=64 batch=4 seq=16"]
    assert (pulled["shapes_pulled"], pulled["entries_added"], pulled["rows"]["inserted"]) == (2, 2, 2)
    expected = {k: v for k, v in files_under(built.root).items() if "unrelated" not in k}
    assert files_under(cache) == expected
    before = rows(db)
    code, second, _ = pull(built, tag, cache, db)
    assert second is not None and (second["shapes_already_present"], second["bytes_downloaded"]) == (2, 0)
    assert rows(db) == before


def registry_files(running: RunningRegistry, digest: str) -> Path:
    """Where the registry stores a blob's bytes (distribution's filesystem driver)."""
    hexa = digest.split(":", 1)[1]
    return running.root / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexa[:2] / hexa / "data"


def image_of(store: list[str]):  # type: ignore[no-untyped-def]
    from warmcache.store.oci.image import read_image
    from warmcache.store.oci.store import OciStore

    oci = OciStore.open(store[1])
    return oci, read_image(oci.client, oci.reference.tag)


def test_the_layers_applied_in_order_are_the_cache_folder(built: Built, tag: list[str], tmp_path: Path) -> None:
    """What a container runtime mounts: every layer unpacked in order over one folder gives the pulled cache, plus
    the metadata."""
    import tarfile

    push(built, tag)
    oci, image = image_of(tag)
    # the two entries hash into two layers
    assert image is not None and image.flavor == "neuron" and len(image.layers) == 2
    mount = tmp_path / "mount"
    manifest = json.loads(oci.client.manifest("prod")[1])  # type: ignore[index]
    assert all(d["mediaType"] == "application/vnd.oci.image.layer.v1.tar" for d in manifest["layers"]), (
        "pushed uncompressed: digest = diff_id"
    )
    for descriptor in manifest["layers"]:
        layer = tmp_path / "layer.tar"
        layer.write_bytes(b"".join(oci.client.blocks(descriptor["digest"], descriptor["size"])))
        with tarfile.open(layer) as tar:
            tar.extractall(mount, filter="data")
    expected = {k: v for k, v in files_under(built.root).items() if "unrelated" not in k}
    mounted = files_under(mount)
    assert {k: v for k, v in mounted.items() if k in expected} == expected
    assert set(mounted) - set(expected) == {
        ".warmcache-image/index.json",
        ".warmcache-image/tag.json",
        "warmcache-guard.json",
    }
    config = json.loads(b"".join(oci.client.blocks(manifest["config"]["digest"], manifest["config"]["size"])))
    assert config["rootfs"]["diff_ids"] == [d["digest"] for d in manifest["layers"]] and config["os"] == "linux"
    assert (
        manifest["annotations"]["dev.warmcache.models"] == "neuron-m"
        and "1x16" in manifest["annotations"]["dev.warmcache.shapes"]
    )


def test_a_tampered_layer_is_refused_and_leaves_nothing_behind(
    built: Built, tag: list[str], registry_host: RunningRegistry, tmp_path: Path
) -> None:
    push(built, tag)
    _, image = image_of(tag)
    layer = image.layers[0]
    stored = registry_files(registry_host, layer.digest)
    data = bytearray(stored.read_bytes())
    data[1024] ^= 0xFF  # a byte inside the first file's content (past its 512-byte header)
    stored.write_bytes(bytes(data))
    cache, db = tmp_path / "host-b" / "cache", tmp_path / "host-b" / "registry.sqlite"
    code, _, err = pull(built, tag, cache, f"sqlite:///{db}")
    assert code == 5, err
    (line,) = error_lines(err)
    assert "corrupt or tampered; refused" in line and tag[1] in line
    assert not (tmp_path / "host-b").exists(), "a refused pull leaves no cache folder and no registry file"


def test_signed_push_is_refused_under_another_key(built: Built, tag: list[str], tmp_path: Path) -> None:
    from warmcache.trust import generate_key

    generate_key(tmp_path / "build-key")
    generate_key(tmp_path / "other-key")
    push(built, tag, "--sign", str(tmp_path / "build-key"))
    cache, db = tmp_path / "b" / "cache", f"sqlite:///{tmp_path / 'b.sqlite'}"
    code, _, err = run(
        "pull",
        str(built.manifest),
        "--cache-dir",
        str(cache),
        "--db",
        db,
        "--trust",
        str(tmp_path / "other-key.pub"),
        *tag,
    )
    assert code == 5 and "not trusted" in err and not cache.exists(), err
    code, pulled, err = run(
        "pull",
        str(built.manifest),
        "--cache-dir",
        str(cache),
        "--db",
        db,
        "--trust",
        str(tmp_path / "build-key.pub"),
        *tag,
    )
    assert code == 1 and pulled is not None and pulled["signatures_checked"] and pulled["shapes_pulled"] == 2, err


def test_a_re_pushed_tag_carries_the_change_and_gc_deletes_only_what_no_tag_references(
    built: Built, registry_host: RunningRegistry, tmp_path: Path
) -> None:
    repository = f"team/gc-{uuid.uuid4().hex[:8]}"
    prod, keep = ["--store", registry_host.url(repository, "prod")], ["--store", registry_host.url(repository, "keep")]
    push(built, prod)
    push(built, keep)  # the same layers under a second tag
    oci, before = image_of(prod)
    neff = built.root / built.entries[0] / "model.neff"
    neff.write_bytes(b"recompiled" + neff.read_bytes())  # the entry changed (its row still names it)
    changed = push(built, prod)
    # the changed entry's layer and the metadata layer go up; the other data layer keeps its digest
    assert (
        changed["indexes_written"],
        changed["indexes_unchanged"],
        changed["blobs_uploaded"],
        changed["blobs_present"],
    ) == (1, 1, 2, 1), changed
    _, after = image_of(prod)
    assert after.superseded[-1].digest == before.digest
    old_layers = {layer.digest for layer in before.layers} - {layer.digest for layer in after.layers}
    assert len(old_layers) == 1

    code, plan, err = run("store", "gc", *prod)  # default grace 24h: the replaced manifest is too young
    assert code == 0 and plan is not None and plan["remove"] == [] and plan["kept_young"] == 1, err
    code, done, err = run("store", "gc", "--grace", "0s", "--apply", *prod)
    assert code == 0 and done is not None, err
    removed = {item["key"] for item in done["remove"]}
    assert f"manifests/{before.digest}" in removed and done["deleted"] == len(removed)
    assert not any(f"blobs/{digest}" in removed for digest in old_layers), "tag keep still uses the old layer"
    assert oci.client.manifest(before.digest) is None
    _, kept = image_of(keep)
    assert all(oci.client.blob_size(blob) is not None for blob in kept.blobs | after.blobs)
    for store, host in ((prod, "p"), (keep, "k")):
        code, pulled, err = pull(built, store, tmp_path / host, f"sqlite:///{tmp_path / host}.sqlite")
        assert pulled is not None and pulled["shapes_pulled"] == 2, err
    assert (tmp_path / "p" / built.entries[0] / "model.neff").read_bytes() == neff.read_bytes()
    assert (tmp_path / "k" / built.entries[0] / "model.neff").read_bytes() != neff.read_bytes()
    code, listing, _ = run("store", "ls", *prod)
    assert listing is not None and [(g["tag"], g["shapes"]) for g in listing["groups"]] == [("keep", 2), ("prod", 2)]
    code, checked, err = run("store", "check", *prod)
    assert code == 0 and checked is not None and checked["ok"], err


def test_concurrent_pushes_of_different_shapes_to_one_tag_keep_every_shape(
    built: Built, tag: list[str], tmp_path: Path
) -> None:
    import threading

    from test_cache_neuron import planned_by_batch

    from warmcache.cache.locate import CacheLocation
    from warmcache.manifest import load_manifest
    from warmcache.registry import Registry
    from warmcache.shipping.shipment import PushRequest, ShipmentScope
    from warmcache.store import OciStore

    planned = planned_by_batch(built.manifest)
    scope = ShipmentScope(load_manifest(built.manifest), CacheLocation(built.root, "neuron", "test"))
    barrier, errors = threading.Barrier(2), []

    def host(identity: str) -> None:
        try:
            with Registry.open(built.url) as registry:
                barrier.wait()
                OciStore.open(tag[1]).push(PushRequest(scope, identities=frozenset([identity])), registry)
        except Exception as exc:  # noqa: BLE001  (surfaced by the assertion below)
            errors.append(exc)

    threads = [threading.Thread(target=host, args=(planned[batch].identity,)) for batch in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    _, image = image_of(tag)
    assert len(image.indexes) == 2, "neither host's shape was lost to the other's write"


def test_basic_auth_credentials_come_from_docker_config_and_never_show(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64

    from warmcache_testkit.oci_registry import oci_registry

    secret = "s3cret-" + uuid.uuid4().hex[:8]
    with oci_registry({"ci": secret}) as running:
        store = ["--store", running.url("team/private", "prod")]
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "nobody"))
        code, _, err = run("push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, *store)
        (line,) = error_lines(err)
        assert code == 6 and "credentials for 127.0.0.1" in line and str(tmp_path / "nobody" / "config.json") in line, (
            err
        )
        docker = tmp_path / "docker"
        docker.mkdir()
        for password, expected in (("wrong", 6), (secret, 0)):
            auth = base64.b64encode(f"ci:{password}".encode()).decode()
            (docker / "config.json").write_text(json.dumps({"auths": {f"http://{running.host}": {"auth": auth}}}))
            monkeypatch.setenv("DOCKER_CONFIG", str(docker))
            code, _, err = run("push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, *store)
            assert code == expected and password not in err, err
        code, pulled, err = pull(built, store, tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}")
        assert pulled is not None and pulled["shapes_pulled"] == 2 and secret not in err, err


def test_skopeo_copies_the_tag_to_a_mirror_and_it_still_pulls(
    built: Built, registry_host: RunningRegistry, tmp_path: Path
) -> None:
    from warmcache_testkit.oci_registry import oci_registry

    from warmcache.trust import generate_key

    generate_key(tmp_path / "key")
    repository = f"team/src-{uuid.uuid4().hex[:8]}"
    source = registry_host.url(repository, "prod")
    push(built, ["--store", source], "--sign", str(tmp_path / "key"))
    with oci_registry() as mirror:  # a mirror keeps the name the tag is signed for (test_tag_rollback: not a rename)
        _copy_and_pull(built, source, mirror.url(repository, "prod"), tmp_path)


def _copy_and_pull(built: Built, source: str, copy: str, tmp_path: Path) -> None:
    import subprocess

    from warmcache_testkit.oci_registry import skopeo_copy

    skopeo_copy(source, copy)
    image = lambda url: "docker://" + url.split("://", 1)[1]  # noqa: E731
    inspected = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", image(copy)], capture_output=True, text=True, timeout=60
    )
    labels = json.loads(inspected.stdout)["Labels"]
    assert (
        labels["dev.warmcache.models"] == "neuron-m"
        and "neuron/" in labels["dev.warmcache.toolchains"]
        and "1x16" in labels["dev.warmcache.shapes"]
    )
    raw = json.loads(
        subprocess.run(
            ["skopeo", "inspect", "--raw", "--tls-verify=false", image(copy)],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    assert raw["annotations"] == labels, "the manifest's annotations say the same"
    assert {d["mediaType"] for d in raw["layers"]} == {"application/vnd.oci.image.layer.v1.tar+gzip"}, (
        "skopeo gzips each layer on the way"
    )
    code, pulled, err = run(
        "pull",
        str(built.manifest),
        "--cache-dir",
        str(tmp_path / "c"),
        "--db",
        f"sqlite:///{tmp_path / 'c.sqlite'}",
        "--trust",
        str(tmp_path / "key.pub"),
        "--store",
        copy,
    )
    assert code == 1 and pulled is not None and pulled["shapes_pulled"] == 2 and pulled["signatures_checked"], err


def test_a_registry_that_is_down_or_stalls_ends_within_the_deadline_in_one_line(built: Built, tmp_path: Path) -> None:
    import socket
    import threading
    import time

    from warmcache_testkit.moto_server import free_port

    down = ["--store", f"oci+http://127.0.0.1:{free_port()}/team/warm:prod"]
    start = time.monotonic()
    code, _, err = run("push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, *down)
    (line,) = error_lines(err)
    assert (
        code == 6
        and "cannot reach the registry" in line
        and down[1].rsplit(":", 1)[0] in line
        and time.monotonic() - start < 15
    ), err

    with socket.socket() as listener:  # accepts connections and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        held: list[socket.socket] = []
        threading.Thread(target=lambda: [held.append(listener.accept()[0]) for _ in range(16)], daemon=True).start()
        stalled = ["--store", f"oci+http://127.0.0.1:{listener.getsockname()[1]}/team/warm:prod", "--timeout", "3s"]
        start = time.monotonic()
        code, _, err = pull(built, stalled, tmp_path / "c", f"sqlite:///{tmp_path / 'c.sqlite'}")
        elapsed = time.monotonic() - start
        for connection in held:
            connection.close()
    (line,) = error_lines(err)
    assert code == 6 and "deadline" in line and elapsed < 10, (elapsed, err)
    assert not (tmp_path / "c").exists()
