"""Store throughput: warmcache push/pull of a 256 MiB cache over S3 and an OCI registry, beside plain clients, and a
no-op pull.

Builds a Neuron-layout cache (64 module folders, each a random 4 MiB NEFF plus its
small files) with one compiled registry row per module, starts moto's standalone
S3 server on 127.0.0.1 (real HTTP, as to AWS), and times, in one run, side by side:

- ``warmcache push`` (hash, skip what the store has, parallel uploads) against a
  plain ``boto3`` loop uploading the same files one after another;
- ``warmcache pull`` into an empty cache and registry (hash-checked, staged,
  renamed into place, rows merged) against a plain ``boto3`` loop downloading the
  same objects one after another;
- the same push and pull to ``oci://`` on Debian's ``docker-registry`` (distribution 2.8)
  against ``skopeo copy`` of the same tag (registry → OCI layout folder, and back into
  another repository);
- a no-op pull: a manifest of 2,000 shapes whose entries are all in the cache, from each store.

moto and the registry run on the same cores, so absolute MiB/s are this machine's,
not S3's or ECR's; the ratios compare clients against the same server in one run.

    python tools/bench/bench_store.py            # 256 MiB, 2,000-entry no-op pull
    python tools/bench/bench_store.py --quick    # 8 MiB, 50 entries: checks the benchmark runs (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from warmcache_testkit.moto_server import DUMMY_CREDENTIALS, create_bucket, moto_server
from warmcache_testkit.oci_registry import MISSING, available, oci_registry

VERSION = "2.15.128.0+bench"
MIB = 1024 * 1024


def build_host(folder: Path, entries: int, neff_bytes: int) -> tuple[Path, Path, str]:
    """A manifest of ``entries`` Neuron shapes, their cache entries, and a registry recording them compiled."""
    from warmcache.identity.plan import plan_manifest
    from warmcache.manifest import load_manifest
    from warmcache.registry import Registry
    from warmcache.registry.records import ArtifactRef

    model = folder / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2}))
    manifest = folder / "manifest.toml"
    batches = ", ".join(str(b) for b in range(1, entries + 1))
    manifest.write_text(
        f'[[model]]\nname = "bench"\npath = "{model}"\ndevice = '
        f'"neuron"\n[[model.generate]]\nbatch_sizes = [{batches}]\nprompt_lengths = '
        "[16]\nmax_cache_len = 64\n"
    )
    cache, url = folder / "cache", f"sqlite:///{folder / 'registry.sqlite'}"
    planned = plan_manifest(load_manifest(manifest))
    with Registry.open(url) as registry:
        registry.ensure_pending(planned)
        for number, shape in enumerate(planned):
            entry = f"neuronxcc-{VERSION}/MODULE_{number:05d}+bench"
            (cache / entry).mkdir(parents=True)
            (cache / entry / "model.neff").write_bytes(os.urandom(neff_bytes))
            (cache / entry / "model.hlo_module.pb").write_bytes(os.urandom(1024))
            (cache / entry / "compile_flags.json").write_text('["-O1"]')
            (cache / entry / "model.done").write_bytes(b"")
            row = registry.claim([shape.identity], "bench", 600)
            assert row is not None
            registry.mark_compiled(
                row.id,
                "bench",
                compile_seconds=1.0,
                graphs_compiled=1,
                artifacts=[ArtifactRef("neuron-module", entry, None)],
            )
    return manifest, cache, url


def timed(label: str, action):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - start
    print(f"  {label:<44} {seconds:8.2f} s", flush=True)
    return seconds, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="8 MiB and 50 no-op entries: only checks that the benchmark runs"
    )
    args = parser.parse_args()
    entries, neff, noop_entries = (8, MIB, 50) if args.quick else (64, 4 * MIB, 2000)
    os.environ.update(DUMMY_CREDENTIALS)

    import boto3

    from warmcache.cache.locate import CacheLocation
    from warmcache.manifest import load_manifest
    from warmcache.registry import Registry
    from warmcache.settings import RegistryLocation
    from warmcache.shipping.shipment import PushRequest, ShipmentScope
    from warmcache.store import BlobStore, StoreLocation, open_store
    from warmcache.store.pull import pull_manifest

    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp, moto_server() as endpoint:
        work = Path(tmp)
        manifest_path, cache, url = build_host(work / "a", entries, neff)
        manifest = load_manifest(manifest_path)
        files = sorted(p for p in cache.rglob("*") if p.is_file())
        total = sum(p.stat().st_size for p in files)
        print(f"cache: {entries} entries, {len(files)} files, {total / MIB:.0f} MiB; moto S3 server at {endpoint}")
        for bucket in ("warmcache", "plain"):
            create_bucket(endpoint, bucket)
        client = boto3.client("s3", endpoint_url=endpoint)
        store = BlobStore(open_store(StoreLocation.parse("s3://warmcache/bench"), endpoint))

        def push() -> object:
            with Registry.open(url) as registry:
                return store.push(
                    PushRequest(ShipmentScope(manifest, CacheLocation(cache, "neuron", "bench"))), registry
                )

        def plain_upload() -> None:
            for path in files:
                client.upload_file(str(path), "plain", path.relative_to(cache).as_posix())

        def pull(into: Path):  # type: ignore[no-untyped-def]
            return pull_manifest(
                ShipmentScope(manifest, CacheLocation(into, "neuron", "bench")),
                RegistryLocation.parse(f"sqlite:///{into}.sqlite"),
                store,
                allow_unsigned=True,
            )

        def plain_download(into: Path) -> None:
            for path in files:
                key = path.relative_to(cache).as_posix()
                (into / key).parent.mkdir(parents=True, exist_ok=True)
                client.download_file("plain", key, str(into / key))

        print("push (upload everything):")
        push_s, _ = timed("warmcache push", push)
        plain_up_s, _ = timed("plain boto3 upload_file loop", plain_upload)
        print("pull (empty cache and registry):")
        pull_s, pulled = timed("warmcache pull (sha256-checked, rows merged)", lambda: pull(work / "b"))
        plain_down_s, _ = timed("plain boto3 download_file loop", lambda: plain_download(work / "plain"))
        assert pulled.pulled == entries and not pulled.missing
        print(
            f"push: {total / MIB / push_s:7.1f} MiB/s vs plain {total / MIB / plain_up_s:7.1f} MiB/s  "
            f"-> {plain_up_s / push_s:.2f}x"
        )
        print(
            f"pull: {total / MIB / pull_s:7.1f} MiB/s vs plain {total / MIB / plain_down_s:7.1f} "
            f"MiB/s  -> {plain_down_s / pull_s:.2f}x"
        )

        print(f"no-op pull of {noop_entries} entries already in the cache:")
        noop_manifest, noop_cache, noop_url = build_host(work / "noop", noop_entries, 16)
        noop_seconds, noop = timed(
            "warmcache pull (nothing to fetch)",
            lambda: pull_manifest(
                ShipmentScope(load_manifest(noop_manifest), CacheLocation(noop_cache, "neuron", "bench")),
                RegistryLocation.parse(noop_url),
                store,
                allow_unsigned=True,
            ),
        )
        assert noop.already_present == noop_entries and noop.pulled == 0
        print(f"no-op pull: {noop_entries} entries in {noop_seconds:.3f} s")
        if not available():
            print(f"oci:// skipped: {MISSING}")
            return
        with oci_registry() as running:
            bench_oci(
                running,
                work,
                manifest,
                cache,
                url,
                entries,
                total,
                (push_s, pull_s),
                (noop_manifest, noop_cache, noop_url, noop_entries),
            )


def bench_oci(
    running,
    work: Path,
    manifest,
    cache: Path,
    url: str,
    entries: int,
    total: int,
    s3_seconds: tuple[float, float],
    noop,
) -> None:  # type: ignore[no-untyped-def]
    """Push and pull through ``oci://`` beside ``skopeo copy`` of the same tag, and a no-op pull, all in this run."""
    import subprocess

    from warmcache.cache.locate import CacheLocation
    from warmcache.manifest import load_manifest
    from warmcache.registry import Registry
    from warmcache.settings import RegistryLocation
    from warmcache.shipping.shipment import PushRequest, ShipmentScope
    from warmcache.store import OciStore
    from warmcache.store.pull import pull_manifest

    store = OciStore.open(running.url("bench/cache", "v1"))
    parsed = manifest

    def push() -> object:
        with Registry.open(url) as registry:
            return store.push(PushRequest(ShipmentScope(parsed, CacheLocation(cache, "neuron", "bench"))), registry)

    def skopeo(source: str, target: str) -> None:
        done = subprocess.run(
            ["skopeo", "copy", "--quiet", "--src-tls-verify=false", "--dest-tls-verify=false", source, target],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr

    print(f"oci:// on docker-registry at {running.host}:")
    push_s, _ = timed("warmcache push (tar layers, includes the 2.5 s settle)", push)
    layout = work / "layout"
    down_s, _ = timed(
        "skopeo copy registry -> oci layout",
        lambda: skopeo(f"docker://{running.host}/bench/cache:v1", f"oci:{layout}:v1"),
    )
    # a second registry: on the first, skopeo would mount the blobs across repositories and send nothing
    with oci_registry() as other:
        up_s, _ = timed(
            "skopeo copy oci layout -> another registry",
            lambda: skopeo(f"oci:{layout}:v1", f"docker://{other.host}/bench/copy:v1"),
        )
    pull_s, pulled = timed(
        "warmcache pull (sha256-checked, rows merged)",
        lambda: pull_manifest(
            ShipmentScope(parsed, CacheLocation(work / "oci-b", "neuron", "bench")),
            RegistryLocation.parse(f"sqlite:///{work}/oci-b.sqlite"),
            store,
            allow_unsigned=True,
        ),
    )
    assert pulled.pulled == entries and not pulled.missing
    mib = total / MIB
    print(f"oci push: {mib / push_s:7.1f} MiB/s vs skopeo copy up {mib / up_s:7.1f} MiB/s  -> {up_s / push_s:.2f}x")
    print(
        f"oci pull: {mib / pull_s:7.1f} MiB/s vs skopeo copy down {mib / down_s:7.1f} MiB/s  -> {down_s / pull_s:.2f}x"
    )
    print(
        f"oci vs s3 (same cache, this run): push {s3_seconds[0] / push_s:.2f}x, pull "
        f"{s3_seconds[1] / pull_s:.2f}x (above 1: oci faster)"
    )
    noop_manifest, noop_cache, noop_url, noop_entries = noop
    noop_seconds, result = timed(
        "warmcache pull from oci:// (nothing to fetch)",
        lambda: pull_manifest(
            ShipmentScope(load_manifest(noop_manifest), CacheLocation(noop_cache, "neuron", "bench")),
            RegistryLocation.parse(noop_url),
            store,
            allow_unsigned=True,
        ),
    )
    assert result.already_present == noop_entries and result.pulled == 0
    print(f"oci no-op pull: {noop_entries} entries in {noop_seconds:.3f} s")


if __name__ == "__main__":
    main()
