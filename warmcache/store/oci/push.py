"""``push`` to ``oci://``: the manifest's compiled shapes merged into the tag's image.

The files are chosen and hashed exactly as for the S3 store (:mod:`warmcache.store.blob.push`),
and each shape gets the same index (signed with ``--sign``). The tag then holds the
shapes it held before plus these (a shape pushed again replaces its earlier index), so
hosts of a fleet can each publish what they compiled to one tag, as they do to one S3
prefix. Layers whose files did not change keep their digest and are not sent again;
a changed layer is rebuilt from the local cache, taking any file this host lacks from
the tag's own layer (checked against its index). A push that changes nothing writes
nothing, unless it signs and the tag's signed document is half-way to expiry: then it
writes the same shapes under a new version (:func:`.freshness.needs_renewal`). A signed push
builds only on a tag its keys verify, no older than this host remembers; ``--fresh`` builds
from the local registry alone (:mod:`.lineage`).

**Concurrent pushes to one tag.** A registry has no compare-and-swap on tags: two hosts
that read the tag, merge and write it back at once would each drop the other's shapes.
So a push writes the manifest only within :data:`MERGE_WINDOW_SECONDS` of reading the
tag it merged into (else it reads again), then waits :data:`SETTLE_SECONDS` and reads the
tag once more: if a concurrent push replaced it with an image lacking this push's
shapes, it merges again. Any write based on a read older than ours lands within the
window after ours, so inside the settle time, where the re-read sees it. The rule holds
while a manifest upload finishes within ``SETTLE - MERGE_WINDOW`` seconds.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmcache.cache.layout import CacheFlavor
from warmcache.cache.locate import CacheLocation
from warmcache.errors import CacheError, StoreError
from warmcache.registry import Registry
from warmcache.shipping.bundle import BundleFile, ByteProgress, sha256_of
from warmcache.shipping.shipment import PushRequest
from warmcache.store.index import outgoing
from warmcache.store.interface import PushResult
from warmcache.store.oci.annotations import summary
from warmcache.store.oci.freshness import TagVersion, needs_renewal
from warmcache.store.oci.image import (
    Descriptor,
    StoredImage,
    Superseded,
    TagStatement,
    config_bytes,
    host_architecture,
    manifest_bytes,
    metadata_members,
    read_image,
)
from warmcache.store.oci.layers import LAYER_MEDIA_TYPE, Layer, by_bucket, extract_files, member_bound, write_layer
from warmcache.store.oci.lineage import Basis, push_basis
from warmcache.store.oci.repository import OciRepository, layers_for
from warmcache.trust import SigningKey, canonical_bytes

MERGE_WINDOW_SECONDS = 1.0
SETTLE_SECONDS = 2.5
#: Merges in all before a push gives up on a tag that concurrent pushes keep replacing.
MERGE_ATTEMPTS = 6
#: Layers built and uploaded at once (each is a tar of its files, written to a temporary folder first).
LAYER_THREADS = 4


def push_image(
    request: PushRequest, registry: Registry, store: OciRepository, progress: ByteProgress | None = None
) -> PushResult:
    """Merge what ``request`` ships (:func:`~warmcache.store.index.outgoing`) into the tag; see the module docstring."""
    out = outgoing(request, registry)
    records, not_compiled, ours = out.records, out.not_compiled, out.indexes
    location, signing_key = request.scope.location, request.signing_key
    local = {f.path: f for files in out.files.values() for f in files}
    policy = store.push_policy
    validity = policy.validity()  # checked before anything is read or sent
    if signing_key:
        store.memory.check_writable()
    with tempfile.TemporaryDirectory(prefix="warmcache-oci-push-") as work:
        builder = _Layers(store, location, local, Path(work), progress)
        for _ in range(MERGE_ATTEMPTS):
            started = time.monotonic()
            basis = push_basis(store, signing_key, policy.trusted, policy.fresh)
            base = basis.base
            merged = _merge(base, ours, location.flavor, store.url)
            if (
                base is not None
                and canonical_bytes(merged) == canonical_bytes(base.indexes)
                and not (signing_key and needs_renewal(base.tag_document, validity, time.time()))
            ):
                return builder.result(len(records), 0, not_compiled)
            pushed_at = time.time()
            manifest = _image(store, builder, basis, merged, location.flavor, signing_key, validity, pushed_at)
            if time.monotonic() - started > MERGE_WINDOW_SECONDS:
                continue  # the layers are built and sent now: read the tag again and merge quickly
            digest = store.client.put_manifest(store.reference.tag, manifest)
            if signing_key:
                store.memory.remember(store.url, TagVersion(basis.version, pushed_at, digest))
            time.sleep(SETTLE_SECONDS)
            now = read_image(store.client, store.reference.tag)
            if now is not None and all(now.indexes.get(key) == index for key, index in ours.items()):
                written = sum(1 for key, index in ours.items() if base is None or base.indexes.get(key) != index)
                return builder.result(len(records), written, not_compiled)
    raise StoreError(
        f"{store.url}: concurrent pushes replaced the tag {MERGE_ATTEMPTS} times before this "
        "push's shapes stayed in it; push again"
    )


def _merge(
    base: StoredImage | None, ours: dict[str, dict[str, Any]], flavor: CacheFlavor, where: str
) -> dict[str, dict[str, Any]]:
    """The tag's shapes with ours added (replacing their earlier indexes).

    An old shape of one of our models that lists one of our files with other bytes is dropped (its entry was compiled
    again); one of another model is not ours to drop: the push is refused, naming the path both claim.
    """
    if base is None:
        return dict(ours)
    if base.flavor != flavor:
        raise CacheError(f"{where}: the tag holds a {base.flavor} cache, this push a {flavor} one; push to another tag")
    ours_files = {file["path"]: file["sha256"] for index in ours.values() for file in index["files"]}
    our_models = {index["model"] for index in ours.values()}
    kept = {}
    for key, index in base.indexes.items():
        clash = next((f["path"] for f in index["files"] if ours_files.get(f["path"], f["sha256"]) != f["sha256"]), None)
        if key in ours or (clash is not None and index.get("model") in our_models):
            continue
        if clash is not None:
            raise CacheError(
                f"{where}: {clash} is also an entry of model {index.get('model')!r}'s shape in this tag, with other "
                "bytes; nothing pushed (push this model to another tag)"
            )
        kept[key] = index
    return {**kept, **ours}


def _image(
    store: OciRepository,
    builder: _Layers,
    basis: Basis,
    indexes: dict[str, dict[str, Any]],
    flavor: CacheFlavor,
    signing_key: SigningKey | None,
    validity: float,
    pushed_at: float,
) -> bytes:
    """Build and upload every blob of the image holding ``indexes`` (version ``basis.version``); its manifest's
    bytes."""
    base = basis.base
    files = {
        file["path"]: BundleFile(file["path"], file["sha256"], file["size"])
        for index in indexes.values()
        for file in index["files"]
    }
    layers = builder.layers(by_bucket(flavor, files.values()), base)
    superseded = list(base.superseded) if base is not None else []
    if basis.found is not None:
        superseded.append(Superseded(basis.found.digest, pushed_at))  # gc removes it once past its grace
    tag = TagStatement(basis.version, pushed_at, validity, signing_key)
    members = metadata_members(store.reference, flavor, indexes, layers, superseded, tag)
    metadata = builder.upload(sorted(members), None)
    labels = summary(flavor, indexes)
    config = config_bytes([layer.digest for layer in layers] + [metadata.digest], labels, host_architecture())
    # A layer kept from the tag keeps the blob it is stored as (a copy may have gzipped it); a new one goes up as a
    # plain tar.
    stored = [
        base.descriptors[layer.digest]
        if base is not None and layer.digest in base.descriptors
        else Descriptor(LAYER_MEDIA_TYPE, layer.digest, layer.size)
        for layer in layers
    ]
    return manifest_bytes(
        (store.client.upload_bytes(config), len(config)),
        stored,
        Descriptor(LAYER_MEDIA_TYPE, metadata.digest, metadata.size),
        labels,
    )


@dataclass
class _Layers:
    """Builds, uploads and remembers layers for one push (a merge retried re-uses what it built)."""

    store: OciRepository
    location: CacheLocation
    local: dict[str, BundleFile]
    work: Path
    progress: ByteProgress | None
    built: dict[tuple[BundleFile, ...], Layer] = field(default_factory=dict)
    #: Layers of the tag taken as they are (their files did not change): present, nothing sent.
    reused: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(
        default_factory=lambda: {"uploaded": 0, "present": 0, "sent": 0, "done": 0, "total": 0}
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def layers(self, groups: list[tuple[BundleFile, ...]], base: StoredImage | None) -> list[Layer]:
        """One layer per group: the tag's own when its files are the same, else built here (in parallel) and uploaded
        if the registry lacks it."""
        stored = {layer.files: layer for layer in base.layers} if base is not None else {}
        self.reused.update(stored[group].digest for group in groups if group in stored)
        todo = [group for group in groups if group not in stored and group not in self.built]
        with self.lock:
            self.counts["total"] += sum(f.size for group in todo for f in group)
        with ThreadPoolExecutor(LAYER_THREADS) as pool:
            for future in [pool.submit(self._build, group, base) for group in todo]:
                future.result()
        return [stored.get(group) or self.built[group] for group in groups]

    def _build(self, group: tuple[BundleFile, ...], base: StoredImage | None) -> None:
        folder = Path(tempfile.mkdtemp(dir=self.work))
        try:
            sources = self._sources(group, base, folder)
            self.built[group] = self.upload([(f.path, sources[f.path]) for f in group], {f.path: f for f in group})
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _sources(self, group: tuple[BundleFile, ...], base: StoredImage | None, folder: Path) -> dict[str, Path]:
        """Where each file's bytes come from: the local cache, or (for a shape another host pushed) the tag's layer,
        checked."""
        sources: dict[str, Path] = {}
        missing: dict[str, BundleFile] = {}
        for file in group:
            path = self.location.root / file.path
            if self.local.get(file.path) == file or (
                path.is_file() and path.stat().st_size == file.size and sha256_of(path) == file.sha256
            ):
                sources[file.path] = path
            else:
                missing[file.path] = file
        if missing:
            if base is None:
                raise CacheError(f"{self.location.root / next(iter(missing))}: not in the cache; nothing pushed")
            for layer, files in layers_for(base.layers, {f.sha256 for f in missing.values()}):
                extract_files(
                    base.layer_blocks(self.store.client, layer.digest),
                    layer.digest,
                    files,
                    folder,
                    self.store.url,
                    max_members=member_bound(layer),
                )
            for name, file in missing.items():
                if not (folder / file.sha256).is_file():
                    raise CacheError(
                        f"{self.store.url}: {name} is in neither this cache nor the tag's layers; nothing pushed"
                    )
                sources[name] = folder / file.sha256
        return sources

    def upload(self, members: list[tuple[str, Path | bytes]], expected: dict[str, BundleFile] | None) -> Layer:
        """Write one layer and send it unless the registry has it already."""
        tar = Path(tempfile.mkstemp(dir=self.work, suffix=".tar")[1])
        try:
            digest, size = write_layer(tar, members, expected)
            files = tuple(expected.values()) if expected else ()
            if self.store.client.blob_size(digest) == size:
                self._count(present=1, done=sum(f.size for f in files))
            else:
                self.store.client.upload(tar, digest, size, lambda n: self._count(done=min(n, size)))
                self._count(uploaded=1, sent=size)
        finally:
            tar.unlink(missing_ok=True)
        return Layer(digest, size, files)

    def _count(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                self.counts[name] += value
            if self.progress and "done" in counts:
                self.progress(min(self.counts["done"], self.counts["total"]), self.counts["total"])

    def result(self, shapes: int, written: int, not_compiled: int) -> PushResult:
        present = self.counts["present"] + len(self.reused)
        return PushResult(
            self.store.url,
            shapes,
            written,
            shapes - written,
            self.counts["uploaded"],
            present,
            self.counts["sent"],
            not_compiled,
        )
