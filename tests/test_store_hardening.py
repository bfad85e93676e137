"""The store under races and damage, on moto's S3 server and a file:// store: gc racing a push never
leaves an index naming a missing blob, push and ``store check --repair`` heal damaged blobs, a file
changed under a push never lands under the old key, and refused pulls leave nothing behind."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import test_bundle
import test_store
from test_bundle import Built
from test_store import _FlakyStore, error_lines, object_store, pull_args, push, run
from warmcache_testkit.moto_server import DUMMY_CREDENTIALS

import warmcache.store.blob.push as push_module
import warmcache.store.deadline as deadline
from warmcache.cache.locate import CacheLocation
from warmcache.errors import CacheError
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.settings import RegistryLocation
from warmcache.shipping.shipment import PushRequest, ShipmentScope
from warmcache.store import BlobStore
from warmcache.store.index import BLOB_PREFIX, INDEX_PREFIX, MAX_INDEX_BYTES, blob_key
from warmcache.store.pull import pull_manifest

built = test_bundle.built
#: gc's grace in these races: S3's LastModified counts whole seconds, so a refresh 0.3 s ago may read as 1.3 s.
GRACE = 2.5
store = test_store.store  # a fresh store: a bucket prefix on the moto server, or a folder


def dangling(store: list[str]) -> list[str]:
    """Every ``index -> blob`` pair whose blob is not in the store."""
    target, out = object_store(store), []
    for item in target.list(INDEX_PREFIX):
        for file in json.loads(target.read(item.key, MAX_INDEX_BYTES) or b"{}")["files"]:
            if target.stat(blob_key(file["sha256"])) is None:
                out.append(f"{item.key} -> {file['sha256']}")
    return out


def push_in_process(built: Built, store: list[str]) -> None:
    with Registry.open(built.url) as registry:
        scope = ShipmentScope(load_manifest(built.manifest), CacheLocation(built.root, "neuron", "test"))
        BlobStore(object_store(store)).push(PushRequest(scope), registry)


@pytest.fixture
def orphaned(built: Built, store: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """A pushed store where one shape's index was withdrawn, so its own blob is unreferenced and older than the
    grace."""
    monkeypatch.setattr(push_module, "REFRESH_AGE_SECONDS", 0.0)  # every blob is "old" here: gc's grace is seconds
    monkeypatch.setattr(push_module, "GC_DECISION_SECONDS", 0.3)
    push(built, store)
    target = object_store(store)
    withdrawn = min(o.key for o in target.list(INDEX_PREFIX))
    target.delete(withdrawn)
    time.sleep(GRACE + 0.2)
    return withdrawn


def test_gc_deciding_while_a_push_reuses_an_old_blob_never_leaves_a_dangling_index(
    built: Built, store: list[str], orphaned: str
) -> None:
    target = object_store(store)
    plan = BlobStore(target).plan_gc(grace_seconds=GRACE)
    assert len(plan.removals) == 1  # the withdrawn shape's own blob
    push_in_process(built, store)  # the window: gc has listed, the push re-uses that blob and names it again
    BlobStore(target).execute_gc(plan)
    assert dangling(store) == [] and target.stat(plan.removals[0].key) is not None


def test_a_whole_gc_between_a_pushs_blob_check_and_its_index_write_never_leaves_a_dangling_index(
    built: Built, store: list[str], orphaned: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, deleted = object_store(store), []
    write_indexes = push_module._write_indexes

    def gc_first(store_: object, indexes: list[tuple[str, bytes]]) -> int:
        deleted.append(BlobStore(target).execute_gc(BlobStore(target).plan_gc(grace_seconds=GRACE)))
        return write_indexes(target, indexes)

    monkeypatch.setattr(push_module, "_write_indexes", gc_first)
    push_in_process(built, store)
    assert deleted == [0] and dangling(store) == []


def test_a_gc_that_takes_a_reused_blob_before_the_push_refreshes_it_is_uploaded_again(
    built: Built, store: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The push saw the blob, then a gc removed it before the refresh: the refresh finds it gone and the push uploads
    it again (it failed once in ten rounds with ``cannot refresh (No such file or directory)``)."""
    push(built, store)
    monkeypatch.setattr(push_module, "REFRESH_AGE_SECONDS", 0.0)  # every re-used blob is refreshed
    monkeypatch.setattr(push_module, "GC_DECISION_SECONDS", 0.0)
    target, refresh, taken = object_store(store), push_module._refresh_reused, []

    def gc_took_them_first(store_: object, reused: list[str], blobs: dict) -> int:
        for sha256 in reused:
            target.delete(blob_key(sha256))
            taken.append(sha256)
        return refresh(store_, reused, blobs)  # type: ignore[arg-type]

    monkeypatch.setattr(push_module, "_refresh_reused", gc_took_them_first)
    code, data, err = run("push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, *store)
    assert code == 0 and data is not None, err
    assert taken and data["blobs_uploaded"] == len(taken) and dangling(store) == []


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("file://", "a file store is file:///absolute/path"),
        ("file://relative/folder", "a file store is file:///absolute/path"),
        ("s3://bucket/prefix?versionId=1", "a query (?...) is not part of a store location"),
        ("s3://bucket/prefix#x", "a fragment (#...) is not part of a store location"),
        ("s3://bucket/pre\nfix", "holds a control character"),
        ("file:///tmp/store\t", "holds a control character"),
    ],
)
def test_a_store_url_whose_parts_a_parser_would_drop_is_refused(url: str, says: str) -> None:
    code, _, err = run("store", "ls", "--store", url)
    assert code == 2 and len(error_lines(err)) == 1 and says in err and "Traceback" not in err, err


def corrupt_in_place(store: list[str], endpoint: str | None) -> str:
    """Flip a blob's bytes, keeping its size: as another tool (no checksum) or a bad disk would."""
    target = object_store(store)
    item = max(target.list(BLOB_PREFIX), key=lambda o: o.size)
    data = b"".join(target.blocks(item.key))
    damaged = bytes([data[0] ^ 0xFF]) + data[1:]
    if store[1].startswith("s3://"):
        bucket, prefix = store[1][5:].split("/", 1)
        boto3.client("s3", endpoint_url=endpoint).put_object(Bucket=bucket, Key=f"{prefix}/{item.key}", Body=damaged)
    else:
        (Path(store[1].removeprefix("file://")) / item.key).write_bytes(damaged)
    return item.key


def endpoint_of(store: list[str]) -> str | None:
    return store[3] if len(store) > 2 else None


def test_push_replaces_a_blob_damaged_in_place_and_pulls_work_again(
    built: Built, store: list[str], tmp_path: Path
) -> None:
    push(built, store)
    key = corrupt_in_place(store, endpoint_of(store))
    again = push(built, store)
    assert (again["blobs_uploaded"], again["blobs_present"]) == (1, 4)
    assert object_store(store).sha256_of(key) == key.rsplit("/", 1)[1]
    code, pulled, err = run(*pull_args(built, store, tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"))
    assert code == 1 and pulled is not None and pulled["shapes_pulled"] == 2, err


def test_s3_blobs_carry_s3s_own_sha256_checksum(built: Built, s3_endpoint: str, s3_bucket: str) -> None:
    push(built, ["--store", f"s3://{s3_bucket}/p", "--endpoint-url", s3_endpoint])
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    key = next(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"] if "/blobs/" in o["Key"])
    assert client.head_object(Bucket=s3_bucket, Key=key, ChecksumMode="ENABLED").get("ChecksumSHA256")


def test_a_file_replaced_while_push_runs_never_lands_under_the_old_key(
    built: Built, store: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    neff = built.root / built.entries[0] / "model.neff"
    upload_missing = push_module._upload_missing

    def replace_then_upload(*args: object, **kwargs: object) -> object:
        neff.write_bytes(bytes(len(neff.read_bytes())))  # same size, other bytes: after push hashed it
        return upload_missing(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(push_module, "_upload_missing", replace_then_upload)
    with pytest.raises(CacheError, match="changed while it was pushed"):
        push_in_process(built, store)
    target = object_store(store)
    assert list(target.list(INDEX_PREFIX)) == []
    assert all(target.sha256_of(o.key) == o.key.rsplit("/", 1)[1] for o in target.list(BLOB_PREFIX))


def test_store_check_finds_a_damaged_blob_and_repair_restores_it_from_a_host_that_has_the_entry(
    built: Built, store: list[str]
) -> None:
    push(built, store)
    key = corrupt_in_place(store, endpoint_of(store))
    code, report, err = run("store", "check", *store)
    assert code == 5 and report is not None, err
    assert (
        [(p["key"], p["problem"]) for p in report["problems"]] == [(key, "damaged")]
        and report["indexes"] == 2
        and report["blobs"] == 5
    )
    code, repaired, err = run("store", "check", *store, "--repair", "--cache-dir", str(built.root))
    assert code == 0 and repaired is not None and repaired["repaired"] == [key], err
    code, clean, _ = run("store", "check", *store)
    assert code == 0 and clean is not None and clean["problems"] == []


def test_store_check_reports_an_index_naming_a_missing_blob(built: Built, tmp_path: Path) -> None:
    store = ["--store", (tmp_path / "store").as_uri()]
    push(built, store)
    target = object_store(store)
    gone = min(o.key for o in target.list(BLOB_PREFIX))
    target.delete(gone)
    code, report, _ = run("store", "check", *store)
    assert (
        code == 5
        and report is not None
        and [(p["key"], p["problem"]) for p in report["problems"]] == [(gone, "missing")]
    )
    code, repaired, _ = run("store", "check", *store, "--repair", "--cache-dir", str(tmp_path / "empty"))
    assert code == 5 and repaired is not None and repaired["repaired"] == [] and repaired["problems"][0]["key"] == gone


def nothing_left(tmp_path: Path) -> bool:
    return not (tmp_path / "b.sqlite").exists() and not (tmp_path / "b").exists()


def test_a_refused_pull_leaves_no_registry_file_and_no_cache_folder(built: Built, tmp_path: Path) -> None:
    store = ["--store", (tmp_path / "store").as_uri()]
    push(built, store)
    corrupt_in_place(store, None)
    code, _, err = run(*pull_args(built, store, tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"))
    assert code == 5 and "fetched 3 times" in err and nothing_left(tmp_path), err
    code, _, err = run(
        *pull_args(
            built, ["--store", (tmp_path / "typo").as_uri()], tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"
        )
    )
    assert code == 6 and nothing_left(tmp_path), err


def test_a_file_store_whose_folder_is_missing_is_exit_6_like_a_missing_bucket(built: Built, tmp_path: Path) -> None:
    code, _, err = run(
        *pull_args(
            built, ["--store", "file:///typo-no-such-store"], tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"
        )
    )
    assert code == 6 and len(error_lines(err)) == 1 and "store folder does not exist" in err, err


def test_progress_counts_each_byte_once_when_a_blob_is_fetched_again(built: Built, tmp_path: Path) -> None:
    push(built, ["--store", (tmp_path / "store").as_uri()])
    seen: list[tuple[int, int]] = []
    location = CacheLocation(tmp_path / "b", "neuron", "test")
    pull_manifest(
        ShipmentScope(load_manifest(built.manifest), location),
        RegistryLocation.parse(f"sqlite:///{tmp_path / 'b.sqlite'}"),
        BlobStore(_FlakyStore(tmp_path / "store")),
        allow_unsigned=True,
        progress=lambda d, t: seen.append((d, t)),
    )
    assert seen and all(done <= total for done, total in seen) and seen[-1][0] == seen[-1][1]


@pytest.fixture(params=["trickle", "silent"])
def slow_endpoint(request: pytest.FixtureRequest) -> Iterator[str]:
    """An S3 endpoint that accepts and then sends one byte every 0.5 s forever (``trickle``), or nothing
    (``silent``)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(connection: socket.socket) -> None:
        with connection:
            while not stop.wait(0.5):
                if request.param == "trickle":
                    try:
                        connection.sendall(b"H")
                    except OSError:
                        return

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    server.close()


def test_a_trickling_or_silent_endpoint_cannot_hold_a_pull_past_its_timeout(
    built: Built, slow_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    store = ["--store", "s3://bucket/p", "--endpoint-url", slow_endpoint]
    code, _, err = run(
        *pull_args(built, store, tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"), "--timeout", "3s"
    )
    assert code == 6 and time.monotonic() - started < 15, err
    assert (
        len(error_lines(err)) == 1 and "the command's deadline" in err and "--timeout" in err and nothing_left(tmp_path)
    ), err
    monkeypatch.setattr(deadline, "REQUEST_SECONDS", 2.0)  # without --timeout, each request has its own deadline (60 s)
    started = time.monotonic()
    code, _, err = run(*pull_args(built, store, tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"))
    assert (
        code == 6 and time.monotonic() - started < 15 and "the per-request deadline" in err and nothing_left(tmp_path)
    ), err


def test_a_timeout_from_the_environment_is_named_as_the_environment(
    s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ["--store", f"s3://{s3_bucket}/p", "--endpoint-url", s3_endpoint]
    monkeypatch.setenv("WARMCACHE_STORE_TIMEOUT", "banana")
    code, _, err = run("store", "ls", *store)
    assert code == 2 and "$WARMCACHE_STORE_TIMEOUT: 'banana' is not an age" in err and "--timeout" not in err, err
    monkeypatch.setenv("WARMCACHE_STORE_TIMEOUT", "0s")  # spent before the first request
    code, _, err = run("store", "ls", *store)
    assert (
        code == 6 and "the command's deadline of 0 s passed" in err and "($WARMCACHE_STORE_TIMEOUT to change it)" in err
    ), err
    code, _, err = run("store", "ls", *store, "--timeout", "0s")  # the flag wins, and is named
    assert code == 6 and "(--timeout to change it)" in err, err
