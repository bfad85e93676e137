"""``store check --repair`` on ``oci://``: a damaged layer rebuilt from the local cache, stored as a blob the registry
serves intact, and every tag that stored the damaged blob pointed at the new one.

Uploading the same bytes again repairs nothing: a registry is content-addressed, and
CNCF distribution (like ECR and most others) keeps the blob it holds under a digest
(``moveBlob``: "the content has already been uploaded") whatever is sent. So the layer
is rebuilt (layers are deterministic: the same files give the same tar, whose digest is
the layer's ``diff_id``), and stored under a digest the damaged blob does not have: the
plain tar when the damaged copy was gzipped (a ``skopeo copy``), else the tar gzipped
(``tar+gzip``, as a copy would store it). The replacement is read back and checked
before any manifest names it. Each tag's manifest then names it in place of the damaged
blob; the config's ``diff_ids``, ``index.json`` and every signature stay as they were, so
the tag is the same image. A tag a push replaced meanwhile is left alone (its push built
its own layers); the manifest a repair replaced is left to the registry's own garbage
collection.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from warmcache.errors import CacheError, StoreError
from warmcache.store.interface import CheckReport, StoreProblem
from warmcache.store.oci.image import Descriptor, StoredImage
from warmcache.store.oci.layers import LAYER_MEDIA_TYPE, Layer, write_layer
from warmcache.store.oci.maintenance import BLOB_KEY, images
from warmcache.store.oci.repository import OciRepository
from warmcache.trust import canonical_bytes


def repair_repository(
    store: OciRepository, report: CheckReport, layers: dict[str, Layer], cache_root: Path
) -> CheckReport:
    """Rebuild each damaged layer from ``cache_root`` and point the tags at an intact copy; the report of what is
    left."""
    repaired: list[str] = []
    left: list[StoreProblem] = []
    current = images(store)
    for problem in report.problems:
        layer = layers.get(problem.key[len(BLOB_KEY) :]) if problem.key.startswith(BLOB_KEY) else None
        if layer is None or not all((cache_root / f.path).is_file() for f in layer.files):
            left.append(problem)
            continue
        with tempfile.TemporaryDirectory(prefix="warmcache-oci-repair-") as folder:
            tar = Path(folder) / "layer.tar"
            try:
                digest, _ = write_layer(
                    tar, [(f.path, cache_root / f.path) for f in layer.files], {f.path: f for f in layer.files}
                )
            except CacheError:
                digest = ""  # the local copy differs: not a repair
            damaged = {image.descriptors[layer.digest].digest for image in current if layer.digest in image.descriptors}
            if digest != layer.digest or not damaged:
                left.append(problem)
                continue
            replacement = _intact_copy(store, tar, damaged)
        for image in current:
            stored = image.descriptors.get(layer.digest)
            if stored is not None and stored.digest in damaged:
                _point_at(store, image, stored, replacement)
        repaired.append(problem.key)
    return CheckReport(report.url, report.indexes, report.blobs, tuple(left), tuple(repaired))


def _intact_copy(store: OciRepository, tar: Path, damaged: set[str]) -> Descriptor:
    """Upload the layer as a blob whose digest no damaged copy has (the plain tar, else gzipped), read back intact."""
    gzipped = tar.with_suffix(".tar.gz")
    with tar.open("rb") as source, gzip.GzipFile(gzipped, "wb", mtime=0) as out:
        shutil.copyfileobj(source, out, 1 << 20)
    for path, media_type in ((tar, LAYER_MEDIA_TYPE), (gzipped, LAYER_MEDIA_TYPE + "+gzip")):
        size = path.stat().st_size
        digest = f"sha256:{_sha256(path)}"
        if digest in damaged:
            continue
        store.client.upload(path, digest, size)
        served = hashlib.sha256()
        for block in store.client.blocks(digest, size):
            served.update(block)
        if f"sha256:{served.hexdigest()}" == digest:
            return Descriptor(media_type, digest, size)
    raise StoreError(f"{store.reference.repository_url}: the registry serves no intact copy of the rebuilt layer")


def _point_at(store: OciRepository, image: StoredImage, stored: Descriptor, replacement: Descriptor) -> None:
    """Rewrite the tag's manifest to name ``replacement`` where it named ``stored``, if the tag was not pushed
    since."""
    found = store.client.manifest(image.tag)
    if found is None or found[0] != image.digest:
        return
    manifest = json.loads(found[1])
    for descriptor in manifest["layers"]:
        if descriptor.get("digest") == stored.digest:
            descriptor.update(mediaType=replacement.media_type, digest=replacement.digest, size=replacement.size)
    store.client.put_manifest(image.tag, canonical_bytes(manifest))


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
