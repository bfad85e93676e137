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
from test_bundle import Built
from test_store import error_lines, run
from warmcache_testkit.oci_registry import RunningRegistry, oci_registry, skopeo_copy

from warmcache.store.oci.image import GUARD_MEMBER, INDEX_MEMBER, TAG_MEMBER, read_image
from warmcache.store.oci.layers import read_members, write_layer
from warmcache.store.oci.store import OciStore
from warmcache.trust import SigningKey, canonical_bytes, generate_key, sign_document

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
    second = push(built, url, tmp_path / "key", "--expires", "8s")  # nothing changed, but a shorter validity: renewed
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


# ------------------------------------------------------------------ what a signer builds on, and what memory holds


def put_tag_document(url: str, document: dict, tmp_path: Path) -> str:
    """Rewrite the tag's ``tag.json`` (as anyone with push rights can: the metadata layer, the config naming it and the
    manifest are rebuilt around it); the new manifest's digest."""
    store = OciStore.open(url)
    found = store.client.manifest(store.reference.tag)
    assert found is not None
    manifest = json.loads(found[1])
    metadata = manifest["layers"][-1]
    data = store.client.read_blob(metadata["digest"], metadata["size"], 1 << 24)
    members = read_members(data, (INDEX_MEMBER, TAG_MEMBER, GUARD_MEMBER), url)
    members[TAG_MEMBER] = canonical_bytes(document)
    digest, size = write_layer(tmp_path / "metadata.tar", sorted(members.items()))
    store.client.upload(tmp_path / "metadata.tar", digest, size)
    config = json.loads(store.client.read_blob(manifest["config"]["digest"], manifest["config"]["size"], 1 << 20))
    config["rootfs"]["diff_ids"][-1] = digest
    config_data = canonical_bytes(config)
    manifest["config"] = {
        **manifest["config"],
        "digest": store.client.upload_bytes(config_data),
        "size": len(config_data),
    }
    manifest["layers"][-1] = {**metadata, "digest": digest, "size": size}
    return store.client.put_manifest(store.reference.tag, canonical_bytes(manifest))


def tag_document(url: str) -> dict:
    document = OciStore.open(url).image().tag_document
    assert document is not None
    return document


def recompile(built: Built, entry: int = 1) -> None:
    """Another shape compiled on the build machine: what the next push sends."""
    neff = built.root / built.entries[entry] / "model.neff"
    neff.write_bytes(b"again" + neff.read_bytes())


def test_a_signer_builds_no_push_on_an_older_signed_one_put_back_under_the_tag(
    built: Built, two_pushes: tuple[str, str, str, Path], tmp_path: Path
) -> None:
    """The laundering sequence: v1, v2, a host pulls v2, v1 is put back, CI pushes another shape with --sign."""
    url, first, second, key = two_pushes
    code, _, err = pull(built, url, key, tmp_path / "host", "--state-dir", str(tmp_path / "host-state"))
    assert code == 1, err
    retag(url, first)
    recompile(built)
    code, _, err = run(
        "push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, "--store", url,
        "--sign", str(key),
    )  # fmt: skip
    (line,) = error_lines(err)
    assert code == 5 and f"{url}: version 1" in line and "older than version 2" in line and "--fresh" in line, err
    assert OciStore.open(url).client.manifest("prod")[0] == first  # nothing pushed  # type: ignore[index]
    fresh = push(built, url, key, "--fresh")  # this registry's shapes alone, above what hosts remember
    assert tag_document(url)["version"] == 3
    code, pulled, err = pull(built, url, key, tmp_path / "host2", "--state-dir", str(tmp_path / "host-state"))
    assert code == 1 and pulled is not None and pulled["shapes_pulled"] == 2, err
    memory = json.loads((tmp_path / "host-state" / "oci-tags.json").read_text())
    assert memory["tags"][url] == {**memory["tags"][url], "version": 3, "digest": fresh}


def test_a_signer_builds_only_on_a_tag_its_keys_verify(
    built: Built, registry_host: RunningRegistry, tmp_path: Path
) -> None:
    """An unsigned tag.json claiming version 10**15 is not signed as 10**15+1 (every host would then refuse every
    later honest push); a tag signed by another key is refused unless --trust names it."""
    generate_key(tmp_path / "key")
    generate_key(tmp_path / "other")
    url = registry_host.url(f"team/u-{uuid.uuid4().hex[:8]}", "prod")
    code, _, err = run("push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, "--store", url)
    assert code == 0, err
    put_tag_document(url, {**tag_document(url), "version": 10**15}, tmp_path)
    args = ["push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, "--store", url]
    code, _, err = run(*args, "--sign", str(tmp_path / "key"))
    (line,) = error_lines(err)
    assert code == 5 and f"{url}: tag document: unsigned" in line and "push --fresh" in line, err
    assert tag_document(url)["version"] == 10**15  # nothing signed
    push(built, url, tmp_path / "key", "--fresh")
    assert tag_document(url)["version"] == 1  # never taken from an unsigned document
    recompile(built)
    code, _, err = run(*args, "--sign", str(tmp_path / "other"))
    (line,) = error_lines(err)
    assert code == 5 and "which is not trusted" in line and "--fresh" in line, err
    push(built, url, tmp_path / "other", "--trust", f"{tmp_path / 'key'}.pub")  # a key rotation
    assert tag_document(url)["version"] == 2


def test_versions_stay_below_2_to_the_53(built: Built, registry_host: RunningRegistry, tmp_path: Path) -> None:
    """The signer refuses to write 2**53 (a JSON reader rounds it), and a puller refuses a signed 2**53 in one line."""
    generate_key(tmp_path / "key")
    signer = SigningKey.load(tmp_path / "key")
    url = registry_host.url(f"team/v-{uuid.uuid4().hex[:8]}", "prod")
    push(built, url, tmp_path / "key")
    put_tag_document(url, sign_document({**tag_document(url), "version": 2**53 - 1}, signer), tmp_path)
    recompile(built)
    for extra in ((), ("--fresh",)):
        code, _, err = run(
            "push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, "--store", url,
            "--sign", str(tmp_path / "key"), *extra,
        )  # fmt: skip
        (line,) = error_lines(err)
        assert code == 5 and "the next version would be 9007199254740992" in line and "2**53-1" in line, err
    assert tag_document(url)["version"] == 2**53 - 1
    put_tag_document(url, sign_document({**tag_document(url), "version": 2**53}, signer), tmp_path)
    code, _, err = pull(built, url, tmp_path / "key", tmp_path / "a")
    (line,) = error_lines(err)
    assert code == 5 and "signed tag version 9007199254740992 is at or above 2**53" in line, err


def test_a_pull_refuses_the_version_it_remembers_with_another_manifest(
    built: Built, registry_host: RunningRegistry, tmp_path: Path
) -> None:
    """The manifest's annotations are not signed: one changed under the tag is the same version, another digest."""
    generate_key(tmp_path / "key")
    url = registry_host.url(f"team/e-{uuid.uuid4().hex[:8]}", "prod")
    signed = push(built, url, tmp_path / "key")
    code, _, err = pull(built, url, tmp_path / "key", tmp_path / "a")
    assert code == 1, err
    store = OciStore.open(url)
    manifest = json.loads(store.client.manifest("prod")[1])  # type: ignore[index]
    other = store.client.put_manifest("prod", canonical_bytes({**manifest, "annotations": {"x": "y"}}))
    code, _, err = pull(built, url, tmp_path / "key", tmp_path / "b")
    (line,) = error_lines(err)
    assert code == 5 and "version 1 (pushed" in line and other[:19] in line and signed[:19] in line, err
    assert "another manifest" in line and not (tmp_path / "b").exists()


def test_a_malformed_memory_entry_is_refused_and_left_as_it_was(
    built: Built, registry_host: RunningRegistry, tmp_path: Path
) -> None:
    """Read as "nothing known", such an entry was rewritten with the older version pulled."""
    generate_key(tmp_path / "key")
    url = registry_host.url(f"team/m-{uuid.uuid4().hex[:8]}", "prod")
    push(built, url, tmp_path / "key")
    state = tmp_path / "host"
    state.mkdir()
    for version in (3.0, "3", 2**60, -5, True, None):
        entry = {"version": version, "pushed_at": 1.0, "digest": "sha256:" + "0" * 64}
        (state / "oci-tags.json").write_text(json.dumps({"format": 1, "tags": {url: entry}}))
        before = (state / "oci-tags.json").read_bytes()
        code, _, err = pull(built, url, tmp_path / "key", tmp_path / "a", "--state-dir", str(state))
        (line,) = error_lines(err)
        assert code == 2 and str(state / "oci-tags.json") in line and f"has version {version!r}" in line, err
        assert (state / "oci-tags.json").read_bytes() == before and not (tmp_path / "a").exists()


def test_a_readable_memory_is_consulted_when_it_cannot_be_written(
    built: Built, two_pushes: tuple[str, str, str, Path], tmp_path: Path
) -> None:
    """A pin below what the host remembers does not override the memory."""
    url, first, _, key = two_pushes
    state = tmp_path / "read-only"
    code, _, err = pull(built, url, key, tmp_path / "a", "--state-dir", str(state))  # remembers version 2
    assert code == 1, err
    (state / "oci-tags.json.lock").unlink(missing_ok=True)
    (state / "oci-tags.json.lock").mkdir()  # no lock can be taken there, even by root (who ignores folder modes)
    state.chmod(0o555)
    try:
        retag(url, first)
        code, _, err = pull(built, url, key, tmp_path / "b", "--state-dir", str(state), "--min-tag-version", "1")
        (line,) = error_lines(err)
        assert code == 5 and "version 1" in line and "older than version 2" in line, err
        assert not (tmp_path / "b").exists()
        assert json.loads((state / "oci-tags.json").read_text())["tags"][url]["version"] == 2
    finally:
        state.chmod(0o755)


def test_an_empty_state_dir_is_refused(
    built: Built, registry_host: RunningRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generate_key(tmp_path / "key")
    url = registry_host.url(f"team/s-{uuid.uuid4().hex[:8]}", "prod")
    push(built, url, tmp_path / "key")
    code, _, err = pull(built, url, tmp_path / "key", tmp_path / "a", "--state-dir", "")
    (line,) = error_lines(err)
    assert code == 2 and "--state-dir: empty" in line, err
    monkeypatch.setenv("WARMCACHE_STATE_DIR", "")
    code, _, err = pull(built, url, tmp_path / "key", tmp_path / "a")
    (line,) = error_lines(err)
    assert code == 2 and "$WARMCACHE_STATE_DIR is set but empty" in line, err


def test_a_signed_tag_valid_past_the_ceiling_is_refused(
    built: Built, registry_host: RunningRegistry, tmp_path: Path
) -> None:
    """A tag that never expires would switch freeze protection off: a year unless --max-expires says more."""
    generate_key(tmp_path / "key")
    url = registry_host.url(f"team/c-{uuid.uuid4().hex[:8]}", "prod")
    args = ["push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, "--store", url]
    for expires, extra, words in (
        ("999999999999d", (), "longer than the 365 days"),
        ("10000000000000000000000s", (), "longer than the 365 days"),
        ("366d", (), "raise the ceiling explicitly with --max-expires"),
        ("400d", ("--max-expires", "99999d"), "--max-expires: '99999d' is not a ceiling"),
    ):
        code, _, err = run(*args, "--sign", str(tmp_path / "key"), "--expires", expires, *extra)
        (line,) = error_lines(err)
        assert code == 2 and words in line, (expires, err)
    assert OciStore.open(url).client.manifest("prod") is None  # nothing pushed
    push(built, url, tmp_path / "key", "--expires", "400d", "--max-expires", "400d")
    document = tag_document(url)
    assert document["expires"] - document["pushed_at"] == 400 * 86400


def test_promote_copies_a_verified_tag_signed_for_its_new_name(
    built: Built, registry_host: RunningRegistry, tmp_path: Path
) -> None:
    """A pipeline's promotion step: a plain copy is refused at pull (signed for its old name); promote keeps both the
    binding and the version floor, and refuses a source it cannot verify."""
    generate_key(tmp_path / "key")
    source = registry_host.url(f"team/p-{uuid.uuid4().hex[:8]}", "candidate")
    target = registry_host.url(f"prod/p-{uuid.uuid4().hex[:8]}", "release")
    push(built, source, tmp_path / "key")
    for version in (1, 2):
        code, promoted, err = run("store", "promote", source, target, "--sign", str(tmp_path / "key"))
        assert code == 0 and promoted is not None and promoted["version"] == version, err
        assert promoted["shapes"] == 2 and promoted["blobs_copied"] == (2 if version == 1 else 0), promoted
    document = tag_document(target)
    assert (f"{document['repository']}:{document['tag']}", document["version"]) == (target.split("/", 3)[3], 2)
    code, pulled, err = pull(built, target, tmp_path / "key", tmp_path / "a")
    assert code == 1 and pulled is not None and pulled["shapes_pulled"] == 2, err
    unsigned = registry_host.url(f"team/q-{uuid.uuid4().hex[:8]}", "candidate")
    code, _, err = run(
        "push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, "--store", unsigned
    )
    assert code == 0, err
    code, _, err = run("store", "promote", unsigned, target, "--sign", str(tmp_path / "key"))
    (line,) = error_lines(err)
    assert code == 5 and f"{unsigned}: tag document: unsigned" in line and tag_document(target)["version"] == 2, err


def test_promote_keeps_the_architecture_the_source_image_was_built_for(
    built: Built, registry_host: RunningRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image pushed from an arm64 build host and promoted from an amd64 CI runner still says arm64: its compiled
    code was built there (promote labelled it with the promoting host's architecture)."""
    import platform

    generate_key(tmp_path / "key")
    source = registry_host.url(f"team/a-{uuid.uuid4().hex[:8]}", "candidate")
    target = registry_host.url(f"prod/a-{uuid.uuid4().hex[:8]}", "release")
    with monkeypatch.context() as arm_host:
        arm_host.setattr(platform, "machine", lambda: "aarch64")
        push(built, source, tmp_path / "key")
    code, _, err = run("store", "promote", source, target, "--sign", str(tmp_path / "key"))
    assert code == 0, err
    for url in (source, target):
        store = OciStore.open(url)
        image = read_image(store.client, store.reference.tag)
        assert image is not None and image.architecture == "arm64", url
    store = OciStore.open(target)  # a config rewritten by anyone with push rights: read, and refused
    found = store.client.manifest(store.reference.tag)
    assert found is not None
    manifest = json.loads(found[1])
    config = json.loads(store.client.read_blob(manifest["config"]["digest"], manifest["config"]["size"], 1 << 20))
    config_data = canonical_bytes({**config, "architecture": "arm64/../x"})
    manifest["config"] = {
        **manifest["config"],
        "digest": store.client.upload_bytes(config_data),
        "size": len(config_data),
    }
    store.client.put_manifest(store.reference.tag, canonical_bytes(manifest))
    code, _, err = run("store", "ls", "--store", target)
    (line,) = error_lines(err)
    assert code != 0 and "the image config's architecture is 'arm64/../x'" in line, err


def test_a_signer_builds_on_an_expired_tag_only_where_it_is_its_own_last_push(
    built: Built, registry_host: RunningRegistry, tmp_path: Path
) -> None:
    """An expired push put back under the tag would be renewed by a signer that does not know it is stale."""
    generate_key(tmp_path / "key")
    url = registry_host.url(f"team/x-{uuid.uuid4().hex[:8]}", "prod")
    push(built, url, tmp_path / "key", "--expires", "2s", "--state-dir", str(tmp_path / "a"))
    time.sleep(max(0.0, tag_document(url)["expires"] - time.time()) + 0.2)
    code, _, err = run(
        "push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, "--store", url,
        "--sign", str(tmp_path / "key"), "--state-dir", str(tmp_path / "b"),
    )  # fmt: skip
    (line,) = error_lines(err)
    assert code == 5 and "signed tag version 1" in line and "expired" in line and "--fresh" in line, err
    push(built, url, tmp_path / "key", "--state-dir", str(tmp_path / "a"))  # its own last push: renewed
    assert tag_document(url)["version"] == 2
