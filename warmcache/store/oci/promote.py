"""``store promote SRC DST``: copy a signed tag to another repository or registry, signed again for its new name.

A signed tag names the repository and tag it was pushed to, so a plain copy
(``skopeo copy``, ``crane copy``) is refused at pull: what stops a rolled-back or
renamed tag also stops a pipeline's promotion step. Promotion keeps both: it verifies
SRC as a pull does (its tag document against the trusted keys, the signer's own among
them; every shape index's signature; no older than this host remembers of SRC), copies
the blobs as they are stored, and writes a new metadata layer whose tag document names
DST, at a version above DST's verified one and what this host remembers of DST (as
``push --fresh`` chooses it, :mod:`.lineage`). The shape indexes keep their own
signatures; the tag document and guard snapshot are signed by the promoting key.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from warmcache.jsonable import fields_json
from warmcache.shipping.bundle import ByteProgress
from warmcache.store.oci.annotations import summary
from warmcache.store.oci.freshness import TagVersion, check_tag
from warmcache.store.oci.image import (
    Descriptor,
    Superseded,
    TagStatement,
    config_bytes,
    manifest_bytes,
    metadata_members,
)
from warmcache.store.oci.layers import LAYER_MEDIA_TYPE, write_layer
from warmcache.store.oci.lineage import push_basis, signer_keys
from warmcache.store.oci.repository import OciRepository
from warmcache.trust import SigningKey, TrustedKeys


@dataclass(frozen=True, slots=True)
class PromoteResult:
    """What a promotion wrote: the tag, its new version and digest, and the blobs it sent."""

    source: str
    target: str
    version: int
    digest: str
    shapes: int
    blobs_copied: int
    blobs_present: int
    bytes_copied: int

    def as_json(self) -> dict[str, object]:
        return fields_json(self)

    def message(self) -> str:
        return (
            f"{self.target}: {self.shapes} shapes promoted from {self.source}, signed as version {self.version} "
            f"({self.digest[:19]}); {self.blobs_copied} blobs copied, {self.blobs_present} already there"
        )


def promote_image(
    source: OciRepository,
    target: OciRepository,
    signing_key: SigningKey,
    trusted: TrustedKeys,
    progress: ByteProgress | None = None,
) -> PromoteResult:
    """Verify ``source``'s tag, copy its image to ``target`` and sign it for ``target`` (see the module docstring)."""
    keys = signer_keys(signing_key, trusted)
    validity = target.push_policy.validity()  # checked before anything is read or sent
    target.memory.check_writable()
    image = source.image()
    seen = check_tag(image.tag_document, image.indexes, source.reference, image.digest, keys)
    for key in image.indexes:
        image.shape_index(key, source.url, keys)
    source.memory.admit(source.url, seen)
    basis = push_basis(target, signing_key, target.push_policy.trusted, fresh=True)
    stored = [image.descriptors[layer.digest] for layer in image.layers]
    copied, present = _copy_blobs(source, target, stored, progress)
    pushed_at = time.time()
    superseded = [Superseded(basis.found.digest, pushed_at)] if basis.found is not None else []
    statement = TagStatement(basis.version, pushed_at, validity, signing_key)
    members = metadata_members(target.reference, image.flavor, image.indexes, list(image.layers), superseded, statement)
    with tempfile.TemporaryDirectory(prefix="warmcache-promote-") as work:
        tar = Path(work) / "metadata.tar"
        digest, size = write_layer(tar, sorted(members))
        target.client.upload(tar, digest, size)
    labels = summary(image.flavor, image.indexes)
    config = config_bytes([layer.digest for layer in image.layers] + [digest], labels, image.architecture)
    manifest = manifest_bytes(
        (target.client.upload_bytes(config), len(config)), stored, Descriptor(LAYER_MEDIA_TYPE, digest, size), labels
    )
    written = target.client.put_manifest(target.reference.tag, manifest)
    target.memory.remember(target.url, TagVersion(basis.version, pushed_at, written))
    return PromoteResult(
        source.url, target.url, basis.version, written, len(image.indexes), len(copied), present, sum(copied)
    )


def _copy_blobs(
    source: OciRepository, target: OciRepository, blobs: list[Descriptor], progress: ByteProgress | None
) -> tuple[list[int], int]:
    """Each data layer's blob, as stored, sent to ``target`` unless there already; the sizes sent, and how many were
    there (the bytes a pull reads are checked there against the signed indexes)."""
    missing = [blob for blob in blobs if target.client.blob_size(blob.digest) != blob.size]
    total, done = sum(blob.size for blob in missing), 0
    with tempfile.TemporaryDirectory(prefix="warmcache-promote-") as work:
        for blob in missing:
            file = Path(work) / "blob"
            with file.open("wb") as out:
                for block in source.client.blocks(blob.digest, blob.size):
                    out.write(block)
                    done += len(block)
                    if progress:
                        progress(done, total)
            target.client.upload(file, blob.digest, blob.size)
    return [blob.size for blob in missing], len(blobs) - len(missing)
