"""One repository on a registry, read and written one tag (one image) at a time: what every ``oci://`` operation
works on (:class:`~warmcache.store.oci.store.OciStore` answers the store interface with them).

A pull speaks the same two steps to it as to an object store (:class:`~warmcache.store.interface.PullSource`): find the
validated index of each wanted shape, then fetch the files they list into the pull's
checked-blob folder; everything after that (placing entries, merging rows, refusing
with nothing left behind) is the one implementation in :mod:`warmcache.store.pull`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

from warmcache.cache.locate import CacheLocation
from warmcache.errors import CacheError, StoreError
from warmcache.identity.plan import PlannedShape
from warmcache.shipping.bundle import BundleFile, sha256_of
from warmcache.store.index import ShapeIndex, index_key
from warmcache.store.oci.client import RegistryClient
from warmcache.store.oci.freshness import PushPolicy, TagMemory, check_tag
from warmcache.store.oci.image import StoredImage, read_image
from warmcache.store.oci.layers import Layer, extract_files, member_bound
from warmcache.store_location import OciReference
from warmcache.trust import TrustedKeys


class OciRepository:
    """``oci://HOST/REPOSITORY:TAG``: the tag push writes and pull reads; ``store`` commands cover every tag of the
    repository."""

    def __init__(self, reference: OciReference, memory: TagMemory | None = None) -> None:
        self.reference = reference
        self.url = reference.url
        self.client = RegistryClient(reference)
        #: What this host remembers of the tags it pulled: a signed tag older than that is refused.
        self.memory = memory or TagMemory.resolve()
        #: How a push to this tag signs and what it builds on (``push --expires``, ``--max-expires``, ``--trust``,
        #: ``--fresh``): see :mod:`.freshness` and :mod:`.lineage`.
        self.push_policy = PushPolicy()
        self._image: StoredImage | None = None

    def image(self) -> StoredImage:
        """The tag's image, read once per command; :class:`StoreError` naming the tags there are when it has none."""
        if self._image is None:
            image = read_image(self.client, self.reference.tag)
            if image is None:
                tags = self.client.tags()
                there = f"its tags: {', '.join(sorted(tags)[:10])}" if tags else "the repository has no tags"
                raise StoreError(f"{self.url}: no such tag ({there})")
            self._image = image
        return self._image

    # ------------------------------------------------------------ pull (warmcache.store.interface.PullSource)

    def read_indexes(
        self, wanted: list[PlannedShape], location: CacheLocation, trusted: TrustedKeys
    ) -> dict[str, ShapeIndex]:
        """The validated (and, with ``trusted`` keys, signature-checked) index of each wanted shape the tag holds, by
        identity.

        With ``trusted`` keys the tag document is verified first: signed for this repository and tag, listing every
        index the image holds, and no older than what this host pulled before (:mod:`.freshness`).
        """
        image = self.image()
        if trusted.configured:
            seen = check_tag(image.tag_document, image.indexes, self.reference, image.digest, trusted)
            self.memory.admit(self.url, seen)
        if wanted and image.flavor != location.flavor:
            raise CacheError(
                f"{self.url}: the tag holds a {image.flavor} cache, but {location.root} is a "
                f"{location.flavor} cache; refused"
            )
        found: dict[str, ShapeIndex] = {}
        for planned in wanted:
            key = index_key(planned.model.name, planned.toolchain.hash, planned.identity)
            if key in image.indexes:
                found[planned.identity] = image.shape_index(key, self.url, trusted)
        return found

    def fetch_blobs(
        self, sizes: dict[str, int], folder: Path, progress: Callable[[int, int], None] | None
    ) -> tuple[int, int]:
        """Each wanted file (by sha256) checked into ``folder/<sha256>``, taken from the fewest layers that hold them;
        ``(downloaded, reused)`` bytes.

        A file kept from an interrupted pull is re-used once its bytes are checked again.
        """
        folder.mkdir(parents=True, exist_ok=True)
        needed, reused = {}, 0
        for sha256, size in sizes.items():
            kept = folder / sha256
            if kept.is_file() and kept.stat().st_size == size and sha256_of(kept) == sha256:
                reused += size
            else:
                needed[sha256] = size
        image = self.image()
        plan = layers_for(image.layers, set(needed))
        total, done, lock = sum(layer.size for layer, _ in plan), [0], threading.Lock()

        def advance(nbytes: int) -> None:
            with lock:
                done[0] += nbytes
                if progress:
                    progress(done[0], total)

        for layer, files in plan:
            try:
                extract_files(
                    image.layer_blocks(self.client, layer.digest),
                    layer.digest,
                    files,
                    folder,
                    self.url,
                    advance,
                    max_members=member_bound(layer),
                )
            except CacheError:
                # what the refused layer gave is not trusted to stay (the signed hashes held, but be strict)
                for file in files.values():
                    with contextlib.suppress(OSError):
                        (folder / file.sha256).unlink()
                raise
        absent = [sha for sha in needed if not (folder / sha).is_file()]
        if absent:
            raise CacheError(
                f"{self.url}: no layer of the tag holds the file with sha256 {absent[0][:16]}… that its "
                "index lists; refused"
            )
        return done[0], reused


def layers_for(layers: tuple[Layer, ...], needed: set[str]) -> list[tuple[Layer, dict[str, BundleFile]]]:
    """The layers to download for ``needed`` sha256s (in the image's order, each only if it adds one), with the
    members to take from each."""
    plan: list[tuple[Layer, dict[str, BundleFile]]] = []
    left = set(needed)
    for layer in layers:
        take: dict[str, BundleFile] = {}
        for file in layer.files:
            if file.sha256 in left:
                take[file.path] = file
                left.discard(file.sha256)
        if take:
            plan.append((layer, take))
    return plan
