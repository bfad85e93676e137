"""``store ls|gc|check`` on an ``oci://`` repository: every tag's image, as the S3 commands see every index.

**gc.** The registry API lists tags, not blobs, so gc deletes what it can name: each push
records the manifest it replaced (:class:`~warmcache.store.oci.image.Superseded`), and gc
deletes those replaced longer ago than ``--grace`` (a pod may still be pulling one) that no
tag points at, then each of their blobs that no tag's image and no younger replaced
manifest uses. A blob a push re-uses is therefore never deleted (a current tag names it),
and a push whose manifest names a blob gc took meanwhile is refused by the registry
(``MANIFEST_BLOB_UNKNOWN``), never stored half-broken. What an interrupted push uploaded
without writing a manifest is named by nothing: the registry's own garbage collection
(``registry garbage-collect``) reclaims it.

**check.** Every tag's image is read, every shape index validated (its signature too,
with trusted keys), and every layer downloaded and checked: its digest, and each file
it lists against the sha256 the signed index gives. ``--repair`` is :mod:`.repair`.
"""

from __future__ import annotations

import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from warmcache.errors import CacheError, StoreError
from warmcache.shipping.bundle import BundleFile
from warmcache.store.interface import CheckReport, GcPlan, StoreGroup, StoreListing, StoreProblem
from warmcache.store.objects import StoredObject
from warmcache.store.oci.image import StoredImage, read_image
from warmcache.store.oci.layers import Layer, extract_files, member_bound
from warmcache.store.oci.repository import OciRepository
from warmcache.trust import NOT_CONFIGURED, TrustedKeys

MANIFEST_KEY, BLOB_KEY = "manifests/", "blobs/"


def images(store: OciRepository) -> list[StoredImage]:
    """Every tag's image; one that is not a readable warmcache image stops the caller (gc must not decide on a
    partial view)."""
    found = []
    for tag in sorted(store.client.tags()):
        image = read_image(store.client, tag)
        if image is not None:  # deleted since the listing
            found.append(image)
    return found


def list_repository(store: OciRepository) -> StoreListing:
    """Shapes per tag, model and toolchain, and the distinct blobs the tags use."""
    groups: dict[tuple[str, str, str], int] = defaultdict(int)
    newest: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for image in images(store):
        newest[image.tag] = image.pushed_at
        for key in image.indexes:
            _, model, toolchain, _ = key.split("/", 3)
            groups[(image.tag, model, toolchain)] += 1
        sizes.update({d.digest: d.size for d in image.descriptors.values()})
    listed = tuple(
        StoreGroup(model, toolchain, shapes, newest[tag], tag)
        for (tag, model, toolchain), shapes in sorted(groups.items())
    )
    return StoreListing(store.reference.repository_url, listed, len(sizes), sum(sizes.values()))


def plan_repository_gc(store: OciRepository, grace_seconds: float, now: float | None = None) -> GcPlan:
    """The replaced manifests older than the grace period, and the blobs only they use."""
    now = time.time() if now is None else now
    current = images(store)
    removals = _unreferenced(store, current, grace_seconds, now)
    young = sum(1 for image in current for s in image.superseded if now - s.at < grace_seconds)
    referenced = set().union(*(image.blobs for image in current)) if current else set()
    return GcPlan(
        store.reference.repository_url,
        sum(len(i.indexes) for i in current),
        len(referenced),
        tuple(removals),
        young,
        grace_seconds,
    )


def execute_repository_gc(store: OciRepository, plan: GcPlan) -> int:
    """Delete the plan's manifests, then its blobs, each only if still unreferenced now (tags are read again first)."""
    current = images(store)
    tagged = {image.digest for image in current}
    referenced = set().union(*(image.blobs for image in current)) if current else set()
    deleted = 0
    # manifests first: no manifest ever names a missing blob
    for item in sorted(plan.removals, key=lambda r: not r.key.startswith(MANIFEST_KEY)):
        digest = item.key.split("/", 1)[1]
        if item.key.startswith(MANIFEST_KEY) and digest not in tagged:
            store.client.delete_manifest(digest)
            deleted += 1
        elif item.key.startswith(BLOB_KEY) and digest not in referenced:
            store.client.delete_blob(digest)
            deleted += 1
    return deleted


def _unreferenced(
    store: OciRepository, current: list[StoredImage], grace_seconds: float, now: float
) -> list[StoredObject]:
    """Replaced manifests older than the grace period that no tag points at, then the blobs only they use."""
    tagged = {image.digest for image in current}
    referenced = set().union(*(image.blobs for image in current)) if current else set()
    old = {
        s.digest: s.at
        for image in current
        for s in image.superseded
        if now - s.at >= grace_seconds and s.digest not in tagged
    }
    young = {s.digest for image in current for s in image.superseded if now - s.at < grace_seconds}
    for digest in young:  # a pod may still be pulling a manifest replaced within the grace period: its blobs stay
        image = read_image(store.client, digest)
        referenced |= image.blobs if image is not None else set()
    removals: list[StoredObject] = []
    blobs: dict[str, tuple[int, float]] = {}
    for digest, at in sorted(old.items()):
        image = read_image(store.client, digest)
        if image is None:
            continue  # deleted by an earlier gc
        removals.append(StoredObject(f"{MANIFEST_KEY}{digest}", 0, at))
        sizes = {d.digest: d.size for d in image.descriptors.values()}
        blobs.update({blob: (sizes.get(blob, 0), at) for blob in image.blobs if blob not in referenced})
    return removals + [StoredObject(f"{BLOB_KEY}{blob}", size, at) for blob, (size, at) in sorted(blobs.items())]


def check_repository(
    store: OciRepository, trusted: TrustedKeys = NOT_CONFIGURED, progress: Callable[[int, int], None] | None = None
) -> tuple[CheckReport, dict[str, Layer]]:
    """The report, and each problem layer by digest (what a repair rebuilds)."""
    problems: list[StoreProblem] = []
    layers: dict[str, tuple[Layer, StoredImage]] = {}
    indexes = 0
    for image in images(store):
        listed: dict[str, BundleFile] = {}
        for key in image.indexes:
            indexes += 1
            try:
                index = image.shape_index(key, f"{store.reference.repository_url}:{image.tag}", trusted)
            except CacheError as exc:  # TrustError included
                problems.append(StoreProblem(f"{image.tag}/{key}", "index", str(exc)))
                continue
            listed.update(index.files)
        held = {file.path for layer in image.layers for file in layer.files}
        problems += [
            StoreProblem(f"{image.tag}/{path}", "missing", "listed by an index, in no layer")
            for path in sorted(set(listed) - held)
        ]
        layers.update({layer.digest: (layer, image) for layer in image.layers})
    total, done = sum(layer.size for layer, _ in layers.values()), [0]

    def advance(nbytes: int) -> None:
        done[0] += nbytes
        if progress:
            progress(done[0], total)

    for digest, (layer, image) in sorted(layers.items()):
        with tempfile.TemporaryDirectory(prefix="warmcache-oci-check-") as folder:
            try:
                found = extract_files(
                    image.layer_blocks(store.client, digest),
                    digest,
                    {f.path: f for f in layer.files},
                    Path(folder),
                    store.url,
                    advance,
                    max_members=member_bound(layer),
                )
            except (CacheError, StoreError) as exc:
                problems.append(StoreProblem(f"{BLOB_KEY}{digest}", "damaged", str(exc)))
                continue
        if len(found) != len(layer.files):
            problems.append(
                StoreProblem(
                    f"{BLOB_KEY}{digest}", "damaged", f"holds {len(found)} of the {len(layer.files)} files it lists"
                )
            )
    damaged = {
        p.key[len(BLOB_KEY) :]: layers[p.key[len(BLOB_KEY) :]][0] for p in problems if p.key.startswith(BLOB_KEY)
    }
    return CheckReport(store.reference.repository_url, indexes, len(layers), tuple(problems)), damaged
