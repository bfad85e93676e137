"""push/pull/store on hand-built Neuron caches, over moto's S3 server (real HTTP) and a file:// store.

Round trip and idempotence, concurrent pushes of overlapping shapes, a corrupted
blob (refused, and fetched again when the corruption was in transit), an
interrupted pull resumed, the size limit, gc, signed indexes checked against
trusted keys, and the one-line failures: an unreachable endpoint, a missing
bucket, no credentials.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import test_bundle
from test_bundle import Built, files_under, rows
from test_cache_neuron import cli, planned_by_batch
from warmcache_testkit.moto_server import free_port

from warmcache.cache.locate import CacheLocation
from warmcache.errors import StoreError
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.settings import RegistryLocation, default_registry
from warmcache.shipping.shipment import PushRequest, ShipmentScope
from warmcache.store import BlobStore, StoreLocation, open_store
from warmcache.store.blob.backends import FileStore
from warmcache.store.index import BLOB_PREFIX, INDEX_PREFIX, blob_key, index_bytes
from warmcache.store.pull import BLOB_FOLDER, pull_manifest
from warmcache.trust import generate_key

#: The build machine of the bundle tests: two compiled Neuron shapes, one declared but not compiled.
built = test_bundle.built


@pytest.fixture(params=["s3", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """CLI arguments naming a fresh store: a bucket prefix on the moto server, or a folder."""
    if request.param == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        return ["--store", f"s3://{bucket}/team/warm", "--endpoint-url", request.getfixturevalue("s3_endpoint")]
    return ["--store", (tmp_path / "store").as_uri()]


def run(*args: str) -> tuple[int, dict | None, str]:
    result = cli(*args, "--json")
    try:
        data = json.loads(result.stdout)
    except ValueError:
        data = None
    return result.exit_code, data, result.stderr


def error_lines(stderr: str) -> list[str]:
    """The error lines (progress lines go to stderr too)."""
    return [line for line in stderr.splitlines() if line.startswith("warmcache: error:")]


def push(built: Built, store: list[str], *extra: str) -> dict:
    code, data, err = run(
        "push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, *store, *extra
    )
    assert code == 0 and data is not None, err
    return data


def pull_args(built: Built, store: list[str], cache: Path, db: str) -> list[str]:
    return ["pull", str(built.manifest), "--cache-dir", str(cache), "--db", db, "--allow-unsigned", *store]


def object_store(store: list[str]):
    return open_store(StoreLocation.parse(store[1]), store[3] if len(store) > 2 else None)


def test_push_then_pull_installs_the_entries_and_rows_and_a_second_run_does_nothing(
    built: Built, store: list[str], tmp_path: Path
) -> None:
    first = push(built, store)
    # 8 files, 5 distinct contents: both modules share their HLO, flags and empty done marker.
    assert (first["shapes"], first["indexes_written"], first["blobs_uploaded"], first["declared_but_not_compiled"]) == (
        2,
        2,
        5,
        1,
    )
    again = push(built, store)
    assert (again["indexes_written"], again["indexes_unchanged"], again["blobs_uploaded"], again["blobs_present"]) == (
        0,
        2,
        0,
        5,
    )

    cache, db = tmp_path / "host-b-cache", f"sqlite:///{tmp_path / 'host-b.sqlite'}"
    code, pulled, err = run(*pull_args(built, store, cache, db))
    assert code == 1, err  # the manifest declares a third shape nobody compiled
    assert pulled is not None and pulled["missing_in_store"] == [
        "neuron-m/generate float32 max_cache_len=64 batch=4 seq=16"
    ]
    assert (pulled["shapes_pulled"], pulled["entries_added"], pulled["rows"]["inserted"]) == (2, 2, 2)
    expected = {k: v for k, v in files_under(built.root).items() if "unrelated" not in k}
    assert files_under(cache) == expected  # byte for byte, and no work folder left behind
    plan = json.loads(cli("plan", str(built.manifest), "--db", db, "--json").stdout)
    assert sorted(i["status"] for i in plan) == ["compiled", "compiled", "missing"]

    before = rows(db)
    code, second, _ = run(*pull_args(built, store, cache, db))
    assert code == 1 and second is not None
    assert (second["shapes_already_present"], second["shapes_pulled"], second["bytes_downloaded"]) == (2, 0, 0)
    assert rows(db) == before and files_under(cache) == expected

    shutil.rmtree(cache / built.entries[0])  # the row still says compiled, but its entry is gone
    code, third, _ = run(*pull_args(built, store, cache, db))
    assert third is not None and (third["shapes_already_present"], third["shapes_pulled"], third["entries_added"]) == (
        1,
        1,
        1,
    )
    assert files_under(cache) == expected


def test_concurrent_pushes_of_overlapping_shapes_store_each_blob_and_index_once(
    built: Built, store: list[str], tmp_path: Path
) -> None:
    manifest = load_manifest(built.manifest)
    planned = planned_by_batch(built.manifest)
    location = CacheLocation(built.root, "neuron", "test")
    subsets = [
        [planned[1].identity, planned[2].identity],
        [planned[2].identity],
        [planned[1].identity, planned[2].identity],
        [planned[1].identity],
    ]
    barrier, errors = threading.Barrier(len(subsets)), []

    def host(identities: list[str]) -> None:
        try:
            with Registry.open(built.url) as registry:
                barrier.wait()
                request = PushRequest(ShipmentScope(manifest, location), identities=frozenset(identities))
                BlobStore(object_store(store)).push(request, registry)
        except Exception as exc:  # noqa: BLE001  (surfaced by the assertion below)
            errors.append(exc)

    threads = [threading.Thread(target=host, args=(s,)) for s in subsets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    target = object_store(store)
    assert len([o for o in target.list(INDEX_PREFIX)]) == 2
    blobs = [o.key for o in target.list(BLOB_PREFIX)]
    assert len(blobs) == 5 and all(".warmcache-tmp-" not in key for key in blobs)
    _, pulled, err = run(*pull_args(built, store, tmp_path / "c", f"sqlite:///{tmp_path / 'c.sqlite'}"))
    assert pulled is not None and pulled["shapes_pulled"] == 2, err


def _corrupt_one_blob(store: list[str]) -> str:
    target = object_store(store)
    key = min(o.key for o in target.list(BLOB_PREFIX))
    target.write(key, b"not what the index says")
    return key


def test_a_corrupted_blob_is_refused_and_nothing_is_installed(built: Built, store: list[str], tmp_path: Path) -> None:
    push(built, store)
    key = _corrupt_one_blob(store)
    cache, db = tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"
    code, _, err = run(*pull_args(built, store, cache, db))
    assert code == 5
    assert (
        key in err
        and "does not match the listed sha256 and size" in err
        and "fetched 3 times" in err
        and len(error_lines(err)) == 1
    )
    assert rows(db) == [] and not [p for p in cache.rglob("*") if p.is_file() and BLOB_FOLDER not in p.as_posix()]


class _FlakyStore(FileStore):
    """A file store whose first read of each blob returns damaged bytes (a corruption in transit)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: dict[str, int] = {}

    def blocks(self, key: str) -> Iterator[bytes]:
        self.reads[key] = self.reads.get(key, 0) + 1
        for block in super().blocks(key):
            yield bytes([block[0] ^ 0xFF]) + block[1:] if self.reads[key] == 1 else block


def test_a_blob_damaged_in_transit_is_fetched_again(built: Built, tmp_path: Path) -> None:
    push(built, ["--store", (tmp_path / "store").as_uri()])
    flaky = _FlakyStore(tmp_path / "store")
    manifest = load_manifest(built.manifest)
    result = pull_manifest(
        ShipmentScope(manifest, CacheLocation(tmp_path / "b", "neuron", "test")),
        RegistryLocation.parse(f"sqlite:///{tmp_path / 'b.sqlite'}"),
        BlobStore(flaky),
        allow_unsigned=True,
    )
    # Every blob with bytes was damaged once and fetched again; the empty model.done has nothing to damage.
    assert result.pulled == 2 and sorted(flaky.reads.values()) == [1, 2, 2, 2, 2]


class _DyingStore(FileStore):
    """A file store that fails after serving ``allowed`` blobs: the network drops mid-pull."""

    def __init__(self, root: Path, allowed: int) -> None:
        super().__init__(root)
        self.allowed, self.lock = allowed, threading.Lock()

    def blocks(self, key: str) -> Iterator[bytes]:
        with self.lock:
            self.allowed -= 1
            dead = self.allowed < 0
        if dead:
            raise StoreError(f"{self.url}/{key}: connection reset")
        yield from super().blocks(key)


def test_an_interrupted_pull_leaves_no_entry_or_row_and_resumes_without_refetching(
    built: Built, tmp_path: Path
) -> None:
    push(built, ["--store", (tmp_path / "store").as_uri()])
    manifest, cache, db = load_manifest(built.manifest), tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"
    location = CacheLocation(cache, "neuron", "test")
    with pytest.raises(StoreError, match="connection reset"):
        pull_manifest(
            ShipmentScope(manifest, location),
            RegistryLocation.parse(db),
            BlobStore(_DyingStore(tmp_path / "store", allowed=3)),
            allow_unsigned=True,
        )
    assert rows(db) == []
    assert {p.relative_to(cache).parts[0] for p in cache.iterdir()} == {BLOB_FOLDER}  # no entry, only checked blobs
    kept = len(list((cache / BLOB_FOLDER).iterdir()))
    assert kept >= 1

    code, resumed, err = run(
        "pull",
        str(built.manifest),
        "--cache-dir",
        str(cache),
        "--db",
        db,
        "--allow-unsigned",
        "--store",
        (tmp_path / "store").as_uri(),
    )
    assert code == 1 and resumed is not None, err
    assert resumed["shapes_pulled"] == 2 and resumed["bytes_reused"] > 0 and resumed["entries_added"] == 2
    assert not (cache / BLOB_FOLDER).exists() and len(rows(db)) == 2


def test_pull_refuses_more_than_the_size_limit_before_downloading(
    built: Built, store: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    push(built, store)
    cache, db = tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"
    code, _, err = run(*pull_args(built, store, cache, db), "--max-size", "4K")
    assert code == 5 and "more than the unpack limit of 4.0 KiB" in err and "--max-size" in err
    monkeypatch.setenv("WARMCACHE_MAX_UNPACK_SIZE", "5K")  # bundle unpack's variable bounds a pull too
    code, _, err = run(*pull_args(built, store, cache, db))
    assert code == 5 and "more than the unpack limit of 5.0 KiB" in err
    assert not cache.exists() or not any(cache.iterdir())
    assert rows(db) == []


def test_gc_plans_first_then_deletes_only_unreferenced_blobs(built: Built, store: list[str], tmp_path: Path) -> None:
    push(built, store)
    target = object_store(store)
    doomed = next(o.key for o in target.list(INDEX_PREFIX) if planned_by_batch(built.manifest)[1].identity in o.key)
    target.delete(doomed)  # as if that shape had been withdrawn
    code, young, _ = run("store", "gc", *store)
    # only its NEFF was its own
    assert code == 0 and young is not None and (young["remove"], young["kept_young"]) == ([], 1)
    code, dry, _ = run("store", "gc", *store, "--grace", "0s")
    assert dry is not None and len(dry["remove"]) == 1 and dry["applied"] is False
    assert len(list(target.list(BLOB_PREFIX))) == 5
    code, done, _ = run("store", "gc", *store, "--grace", "0s", "--apply")
    assert done is not None and done["deleted"] == 1 and len(list(target.list(BLOB_PREFIX))) == 4
    code, listing, _ = run("store", "ls", *store)
    assert (
        listing is not None
        and [(g["model"], g["shapes"]) for g in listing["groups"]] == [("neuron-m", 1)]
        and listing["blobs"] == 4
    )
    code, pulled, err = run(*pull_args(built, store, tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"))
    assert pulled is not None and pulled["shapes_pulled"] == 1, err


def test_an_unreachable_endpoint_is_one_line_after_retries(built: Built, s3_bucket: str) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    code, _, err = run(
        "push",
        str(built.manifest),
        "--cache-dir",
        str(built.root),
        "--db",
        built.url,
        "--store",
        f"s3://{s3_bucket}/x",
        "--endpoint-url",
        endpoint,
    )
    assert code == 6 and len(error_lines(err)) == 1
    assert f"s3://{s3_bucket}/x: cannot reach the S3 endpoint" in err and "after retries" in err


def test_a_missing_bucket_is_one_line_naming_it(built: Built, s3_endpoint: str, s3_bucket: str, tmp_path: Path) -> None:
    code, _, err = run(
        *pull_args(
            built,
            ["--store", "s3://no-such-bucket/p", "--endpoint-url", s3_endpoint],
            tmp_path / "b",
            f"sqlite:///{tmp_path / 'b.sqlite'}",
        )
    )
    assert code == 6 and len(error_lines(err)) == 1 and "bucket 'no-such-bucket' does not exist" in err
    code, _, err = run(
        "push",
        str(built.manifest),
        "--cache-dir",
        str(built.root),
        "--db",
        built.url,
        "--store",
        "s3://no-such-bucket/p",
        "--endpoint-url",
        s3_endpoint,
    )
    assert code == 6 and len(error_lines(err)) == 1 and "bucket 'no-such-bucket' does not exist" in err


def test_no_credentials_is_one_line(
    built: Built, s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code, _, err = run("store", "ls", "--store", f"s3://{s3_bucket}", "--endpoint-url", s3_endpoint)
    assert code == 6 and len(error_lines(err)) == 1 and "no AWS credentials found" in err


def test_the_store_comes_from_the_flag_the_environment_or_the_manifest(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run("store", "ls")
    assert code == 2 and "no store: pass --store" in err
    monkeypatch.setenv("WARMCACHE_STORE", (tmp_path / "env-store").as_uri())
    push(built, [])
    assert (tmp_path / "env-store" / "indexes").is_dir()
    monkeypatch.delenv("WARMCACHE_STORE")
    text = built.manifest.read_text()
    built.manifest.write_text('[store]\nurl = "manifest-store"\n' + text)  # a folder relative to the manifest
    code, _, err = run("store", "ls", "--manifest", str(built.manifest))
    assert code == 6 and f"{(built.manifest.parent / 'manifest-store').as_uri()}: store folder does not exist" in err
    push(built, [])
    code, listing, _ = run("store", "ls", "--manifest", str(built.manifest))
    assert code == 0 and listing is not None and [g["shapes"] for g in listing["groups"]] == [2]


def test_a_hostile_index_is_refused_before_anything_is_written(built: Built, tmp_path: Path) -> None:
    store = ["--store", (tmp_path / "store").as_uri()]
    push(built, store)
    index = next((tmp_path / "store" / "indexes").rglob("*.json"))
    data = json.loads(index.read_bytes())
    data["files"][0]["path"] = "../../etc/passwd"
    index.write_text(json.dumps(data))
    cache, db = tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"
    code, _, err = run(*pull_args(built, store, cache, db))
    assert code == 5 and "climbs out of the cache" in err and index.name in err
    assert not cache.exists() and rows(db) == []


def test_s3_blobs_are_content_addressed_under_the_prefix(built: Built, s3_endpoint: str, s3_bucket: str) -> None:
    push(built, ["--store", f"s3://{s3_bucket}/team/warm", "--endpoint-url", s3_endpoint])
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert all(k.startswith("team/warm/") for k in keys)
    blob = next(k for k in keys if "/blobs/sha256/" in k)
    body = client.get_object(Bucket=s3_bucket, Key=blob)["Body"].read()
    import hashlib

    assert hashlib.sha256(body).hexdigest() == blob.rsplit("/", 1)[1]


def test_cache_scan_and_doctor_classify_neurons_own_s3_cache(
    s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    Registry.open(default_registry()).close()  # scan and doctor read the default registry, never create it
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    modules = {
        "MODULE_done+f": ("model.hlo_module.pb", "model.neff", "model.done"),
        "MODULE_failed+f": ("model.hlo_module.pb", "model.log"),
        "MODULE_locked+f": ("model.hlo_module.pb", "model.hlo_module.pb.lock"),
    }
    for module, names in modules.items():
        for name in names:
            client.put_object(Bucket=s3_bucket, Key=f"neuron-cache/neuronxcc-2.15.1/{module}/{name}", Body=b"x" * 10)
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", f"s3://{s3_bucket}/neuron-cache")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)  # boto3's own setting for an S3-compatible server
    result = cli("cache", "scan", "--json")
    assert result.exit_code == 0, result.output
    [remote] = [info for info in json.loads(result.stdout) if info.get("remote")]
    assert remote["root"] == f"s3://{s3_bucket}/neuron-cache" and remote["states"] == {
        "done": 1,
        "failed": 1,
        "locked": 1,
    }
    assert {e["path"]: e["compiler_version"] for e in remote["entries"]}["neuronxcc-2.15.1/MODULE_done+f"] == "2.15.1"
    doctor = cli("cache", "doctor")
    assert doctor.exit_code == 0, doctor.output
    assert (
        "failed: neuronxcc-2.15.1/MODULE_failed+f" in doctor.stdout
        and "locked: neuronxcc-2.15.1/MODULE_locked+f (lock" in doctor.stdout
    )


@pytest.fixture
def signer(tmp_path: Path) -> tuple[Path, str]:
    """A private key file and its public key text (what --trust takes)."""
    key = tmp_path / "keys" / "build"
    key.parent.mkdir()
    return key, generate_key(key).text


def nothing_pulled(cache: Path, db: str) -> bool:
    """No cache file, no staged blob, no row: a refused pull wrote nothing."""
    return rows(db) == [] and (not cache.exists() or not any(cache.rglob("*")))


def test_a_signed_push_pulls_cleanly_under_trust(
    built: Built, store: list[str], tmp_path: Path, signer: tuple[Path, str]
) -> None:
    key, public = signer
    push(built, store, "--sign", str(key))
    # Ed25519 is deterministic: a re-push writes nothing
    assert push(built, store, "--sign", str(key))["indexes_written"] == 0
    cache, db = tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"
    code, pulled, err = run(*pull_args(built, store, cache, db), "--trust", public)
    assert code == 1 and pulled is not None, err  # exit 1: the declared-but-not-compiled shape
    assert pulled["shapes_pulled"] == 2 and pulled["signatures_checked"] is True and len(rows(db)) == 2
    assert files_under(cache) == {k: v for k, v in files_under(built.root).items() if "unrelated" not in k}


def _tamper_rehashed(store: list[str]) -> str:
    """Replace one blob's bytes and rewrite its sha256 in the index, keeping the old signature."""
    target = object_store(store)
    key = min(o.key for o in target.list(INDEX_PREFIX))
    index = json.loads(target.read(key, 1 << 20) or b"")
    evil = b"compiled by someone else"
    index["files"][0].update(sha256=hashlib.sha256(evil).hexdigest(), size=len(evil))
    target.write(blob_key(index["files"][0]["sha256"]), evil)
    target.write(key, index_bytes(index))
    return key


def test_a_tampered_index_is_refused_under_a_trusted_key_before_anything_is_written(
    built: Built, store: list[str], tmp_path: Path, signer: tuple[Path, str]
) -> None:
    key, public = signer
    push(built, store, "--sign", str(key))
    tampered = _tamper_rehashed(store)
    cache, db = tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"
    code, _, err = run(*pull_args(built, store, cache, db), "--trust", public)
    assert code == 5 and tampered in err and "does not match the content" in err and len(error_lines(err)) == 1, err
    assert nothing_pulled(cache, db)
    # Without trust the hashes alone cannot tell: the same pull installs the replaced file and says so.
    code, pulled, err = run(*pull_args(built, store, cache, db))
    assert pulled is not None and pulled["signatures_checked"] is False and pulled["shapes_pulled"] == 2, err


def test_an_unsigned_index_is_refused_under_trust(
    built: Built, store: list[str], tmp_path: Path, signer: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    push(built, store)
    cache, db = tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"
    monkeypatch.setenv("WARMCACHE_TRUSTED_KEYS", signer[1])
    code, _, err = run(*pull_args(built, store, cache, db))
    assert (
        code == 5
        and "unsigned, but trusted keys are configured ($WARMCACHE_TRUSTED_KEYS" in err
        and len(error_lines(err)) == 1
    ), err
    assert nothing_pulled(cache, db)


def test_pull_says_when_it_did_not_check_signatures(built: Built, tmp_path: Path) -> None:
    store = ["--store", (tmp_path / "store").as_uri()]
    push(built, store)
    result = cli(*pull_args(built, store, tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"))
    assert "index signatures not checked: no trusted keys configured" in result.stdout, result.output


def test_the_manifest_names_the_signing_key_and_the_trusted_keys(
    built: Built, tmp_path: Path, signer: tuple[Path, str]
) -> None:
    key, _ = signer
    store = ["--store", (tmp_path / "store").as_uri()]
    text = built.manifest.read_text()
    built.manifest.write_text(f'[store]\nsign_key = "{key}"\n[trust]\nkeys = ["{key}.pub"]\n' + text)
    push(built, store)  # signed by [store] sign_key, no --sign
    cache, db = tmp_path / "b", f"sqlite:///{tmp_path / 'b.sqlite'}"
    code, pulled, err = run(*pull_args(built, store, cache, db))
    assert pulled is not None and pulled["signatures_checked"] is True and pulled["shapes_pulled"] == 2, err
    _tamper_rehashed(store)
    code, _, err = run(*pull_args(built, store, tmp_path / "c", f"sqlite:///{tmp_path / 'c.sqlite'}"))
    assert code == 5 and "does not match the content" in err, err
