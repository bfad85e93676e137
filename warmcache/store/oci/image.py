"""What a pushed tag is: an OCI image whose layers, applied in order, are a ready cache folder.

::

    manifest (application/vnd.oci.image.manifest.v1+json), annotations: models, toolchains, shapes
      config   (application/vnd.oci.image.config.v1+json): os/architecture, rootfs diff_ids, the same summary as labels
      layers   up to 32 data layers (:mod:`.layers`): the cache entries at their own paths
               1 metadata layer, last: .warmcache-image/index.json and warmcache-guard.json

``index.json`` holds one store index per shape, exactly as the S3 store writes them
(:mod:`warmcache.store.index`: the row, the fingerprints, every file with its sha256 and
size; signed by ``--sign``), which data layer holds which files, and the manifests this
tag replaced (``store gc`` removes them once older than its grace period).
``warmcache-guard.json`` is a ``guard export`` snapshot of the same rows (signed by the
same key): the mounted tag is a snapshot folder, so a pod builds its
:class:`~warmcache.runtime.guard.ShapeGuard` from it with no registry database
(``ShapeGuard.from_snapshot(<mount>, model, trust=...)``). The ``.warmcache-image``
folder starts with ``.warmcache-``, so cache scans, bundles and pushes never take it for
a cache entry.

Layers are pushed uncompressed, but a copy may compress them (``skopeo copy`` to a registry
gzips every layer and drops layer annotations): a layer is therefore found through the
config's ``diff_ids`` (the digest of its uncompressed tar, which is what ``index.json``
records and what every reader checks), and the metadata layer is simply the last one.

Only the shape indexes are trusted (by their signatures); the layer map and the list of
replaced manifests are hints that every reader checks against them: a file is accepted
only if its bytes are what a signed index lists.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from warmcache.bounds import MAX_NESTING, json_nesting
from warmcache.cache.layout import CacheFlavor
from warmcache.cache.locate import FLAVORS
from warmcache.errors import CacheError, shown
from warmcache.runtime.snapshot import (
    HOST_LOCAL,
    SNAPSHOT_FILE,
    SNAPSHOT_FORMAT,
    SNAPSHOT_VERSION,
    decode_snapshot,
    snapshot_document,
)
from warmcache.shipping.bundle import BundleFile
from warmcache.store.index import MAX_INDEX_BYTES, ShapeIndex, index_bytes, parse_index
from warmcache.store.oci.client import BLOCK, MANIFEST_MEDIA_TYPE, RegistryClient
from warmcache.store.oci.freshness import tag_document
from warmcache.store.oci.layers import LAYER_MEDIA_TYPE, Layer, read_members
from warmcache.store.oci.reference import is_digest
from warmcache.store.oci.transport import MAX_ANSWER_BYTES
from warmcache.store_location import OciReference
from warmcache.trust import NOT_CONFIGURED, SigningKey, TrustedKeys, canonical_bytes

IMAGE_FORMAT = 1
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
METADATA_DIR = ".warmcache-image"
INDEX_MEMBER = f"{METADATA_DIR}/index.json"
#: The signed statement binding the image's shapes to its tag and version (:mod:`.freshness`).
TAG_MEMBER = f"{METADATA_DIR}/tag.json"
#: At the cache folder's root, where ``ShapeGuard.from_snapshot(<folder>)`` looks (a snapshot folder holds it beside its
#: entries).
GUARD_MEMBER = SNAPSHOT_FILE
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
DOCKER_GZIP_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
#: Marks the metadata layer among the image's layers (for people: a copy may drop it; readers take the last layer).
LAYER_ROLE = "dev.warmcache.layer"
#: A manifest or config is a few KiB; anything far larger is not ours (a registry's answer is cut there too).
MAX_MANIFEST_BYTES = MAX_ANSWER_BYTES
#: Replaced manifests remembered for gc; older ones are left to the registry's own garbage collection.
MAX_SUPERSEDED = 256
_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
#: What an image config's ``architecture`` may read (OCI's are lowercase words: ``amd64``, ``arm64``, ``ppc64le``).
_ARCHITECTURE_NAME = re.compile(r"[a-z0-9_]{1,32}")


@dataclass(frozen=True, slots=True)
class Superseded:
    """A manifest this tag pointed at before a push replaced it, and when (Unix seconds)."""

    digest: str
    at: float


@dataclass(frozen=True, slots=True)
class Descriptor:
    """A blob as the manifest names it: media type, digest (of the bytes stored, compressed or not) and size."""

    media_type: str
    digest: str
    size: int

    def as_json(self, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        return {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
            **({"annotations": annotations} if annotations else {}),
        }


@dataclass(frozen=True, slots=True)
class StoredImage:
    """A tag as read back: its manifest digest, cache layout, shape indexes (by key), data layers and replaced
    manifests."""

    tag: str
    digest: str
    flavor: CacheFlavor
    indexes: dict[str, dict[str, Any]]
    layers: tuple[Layer, ...]
    superseded: tuple[Superseded, ...]
    #: When the push that wrote this tag finished its metadata (Unix seconds).
    pushed_at: float
    #: The tag document (:mod:`.freshness`) as stored, unverified; ``None`` when the image has none.
    tag_document: dict[str, Any] | None
    #: Every blob the manifest names (config, data layers, metadata layer): what gc must keep.
    blobs: frozenset[str]
    #: Each layer's stored blob by its diff_id (uncompressed digest, as ``index.json`` names layers).
    descriptors: dict[str, Descriptor]
    #: The image config's ``architecture``: the machine the compiled code in its layers was built for.
    architecture: str

    def layer_blocks(self, client: RegistryClient, diff_id: str) -> Iterator[bytes]:
        """The uncompressed bytes of the data layer ``diff_id`` names, at most the size ``index.json`` gives it (the
        caller checks them against ``diff_id``)."""
        size = next(layer.size for layer in self.layers if layer.digest == diff_id)
        return layer_blocks(client, self.descriptors[diff_id], size)

    def shape_index(self, key: str, where: str, trusted: TrustedKeys = NOT_CONFIGURED) -> ShapeIndex:
        """One shape's index, validated as the S3 store validates its own (signature first, with ``trusted`` keys)."""
        return parse_index(index_bytes(self.indexes[key]), key, where, trusted)

    def layer_of(self) -> dict[str, Layer]:
        """Which data layer holds each file path (the first one listing it)."""
        found: dict[str, Layer] = {}
        for layer in self.layers:
            for file in layer.files:
                found.setdefault(file.path, layer)
        return found


def read_image(client: RegistryClient, tag: str) -> StoredImage | None:
    """The tag's image, validated as far as it can be without trust (signatures are checked per shape by the caller);
    ``None`` without the tag."""
    found = client.manifest(tag)
    if found is None:
        return None
    digest, data = found
    where = f"{client.reference.with_tag(tag).url}"
    manifest = _json(data, f"{where}: manifest", MAX_MANIFEST_BYTES)
    layers = manifest.get("layers")
    if (
        manifest.get("mediaType") != MANIFEST_MEDIA_TYPE
        or not isinstance(layers, list)
        or not layers
        or not all(isinstance(layer, dict) for layer in layers)
        or not isinstance(manifest.get("config"), dict)
    ):
        raise CacheError(
            f"{where}: not a warmcache image (an OCI image manifest whose last layer is warmcache's metadata); refused"
        )
    stored = [Descriptor(str(layer.get("mediaType")), _digest(layer, where), layer["size"]) for layer in layers]
    config_digest = _digest(manifest["config"], where)
    config_blob = client.read_blob(config_digest, manifest["config"]["size"], MAX_MANIFEST_BYTES)
    config = _json(config_blob, f"{where}: image config", MAX_MANIFEST_BYTES)
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") if isinstance(config.get("rootfs"), dict) else None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(stored) or not all(isinstance(d, str) for d in diff_ids):
        raise CacheError(f"{where}: the image config's rootfs.diff_ids do not match its {len(stored)} layers; refused")
    descriptors = dict(zip(diff_ids, stored))
    metadata = b"".join(layer_blocks(client, stored[-1], MAX_INDEX_BYTES))
    if f"sha256:{hashlib.sha256(metadata).hexdigest()}" != diff_ids[-1]:
        raise CacheError(f"{where}: the last layer does not hash to its diff_id: corrupt or tampered; refused")
    members = read_members(metadata, (INDEX_MEMBER, TAG_MEMBER), where)
    if INDEX_MEMBER not in members:
        raise CacheError(f"{where}: not a warmcache image (its last layer holds no {INDEX_MEMBER}); refused")
    index = _json(members[INDEX_MEMBER], f"{where}: {INDEX_MEMBER}", MAX_INDEX_BYTES)
    tag_doc = _json(members[TAG_MEMBER], f"{where}: {TAG_MEMBER}", MAX_INDEX_BYTES) if TAG_MEMBER in members else None
    if index.get("format") != IMAGE_FORMAT or index.get("flavor") not in FLAVORS:
        raise CacheError(
            f"{where}: {INDEX_MEMBER} has format {shown(index.get('format'))} and layout "
            f"{shown(index.get('flavor'))} (this warmcache reads format {IMAGE_FORMAT})"
        )
    pushed_at = index.get("pushed_at")
    pushed = float(pushed_at) if isinstance(pushed_at, (int, float)) else 0.0
    blobs = frozenset({config_digest, *(d.digest for d in stored)})
    indexes, layer_map, superseded = _indexes(index, where), _layers(index, where), _superseded(index, where)
    unknown = [layer.digest for layer in layer_map if layer.digest not in descriptors]
    if unknown:
        raise CacheError(
            f"{where}: {INDEX_MEMBER} names layer {unknown[0][:19]}, which the image does not hold; refused"
        )
    architecture = config.get("architecture")
    if not isinstance(architecture, str) or not _ARCHITECTURE_NAME.fullmatch(architecture):
        raise CacheError(f"{where}: the image config's architecture is {shown(architecture)}, not a machine's; refused")
    return StoredImage(
        tag, digest, index["flavor"], indexes, layer_map, superseded, pushed, tag_doc, blobs, descriptors, architecture
    )


def layer_blocks(client: RegistryClient, descriptor: Descriptor, max_bytes: int) -> Iterator[bytes]:
    """A layer blob's bytes, uncompressed: as pushed (``tar``), or gzipped by a copy (``tar+gzip``); refused past
    ``max_bytes`` uncompressed (inflated a block at a time, so a gzip bomb never sits in memory)."""
    where = f"{client.where}: layer {descriptor.digest[:19]}"
    if descriptor.media_type in (LAYER_MEDIA_TYPE, DOCKER_LAYER):
        if descriptor.size > max_bytes:
            raise CacheError(f"{where} is {descriptor.size} bytes, more than the {max_bytes} it may hold; refused")
        yield from client.blocks(descriptor.digest, descriptor.size)
        return
    if descriptor.media_type not in (LAYER_MEDIA_TYPE + "+gzip", DOCKER_GZIP_LAYER):
        raise CacheError(
            f"{where} is {shown(descriptor.media_type)}; warmcache reads tar and tar+gzip layers (copy with "
            "skopeo's default gzip)"
        )
    inflate, produced = zlib.decompressobj(16 + zlib.MAX_WBITS), 0
    for block in client.blocks(descriptor.digest, descriptor.size):
        pending = block
        while pending:
            try:
                out = inflate.decompress(pending, BLOCK)
            except zlib.error as exc:
                raise CacheError(f"{where} is not valid gzip ({exc}); refused") from None
            pending, produced = inflate.unconsumed_tail, produced + len(out)
            if produced > max_bytes:
                raise CacheError(f"{where} inflates past the {max_bytes} bytes it may hold; refused")
            yield out
    yield inflate.flush()


@dataclass(frozen=True, slots=True)
class TagStatement:
    """What a push states in its tag document: the version, when, for how long (seconds), and the key that signs it."""

    version: int
    pushed_at: float
    validity: float
    signing_key: SigningKey | None


def metadata_members(
    reference: OciReference,
    flavor: CacheFlavor,
    indexes: dict[str, dict[str, Any]],
    layers: list[Layer],
    superseded: list[Superseded],
    tag: TagStatement,
) -> list[tuple[str, bytes]]:
    """The metadata layer's files: ``index.json`` (with the manifests this push replaces, for gc), the tag document
    and the ``guard export`` snapshot of the same rows."""
    document = {
        "format": IMAGE_FORMAT,
        "flavor": flavor,
        "pushed_at": tag.pushed_at,
        "indexes": indexes,
        "layers": [
            {"digest": layer.digest, "size": layer.size, "files": [[f.path, f.sha256, f.size] for f in layer.files]}
            for layer in layers
        ],
        "superseded": [[s.digest, s.at] for s in superseded[-MAX_SUPERSEDED:]],
    }
    statement = tag_document(reference, tag.version, tag.pushed_at, indexes, tag.signing_key, tag.validity)
    return [
        (INDEX_MEMBER, canonical_bytes(document)),
        (TAG_MEMBER, canonical_bytes(statement)),
        (GUARD_MEMBER, guard_snapshot(indexes, reference.url, tag.signing_key)),
    ]


def guard_snapshot(indexes: dict[str, dict[str, Any]], source: str, signing_key: SigningKey | None) -> bytes:
    """The rows of ``indexes`` as a ``guard export`` snapshot, signed like the indexes (the build machine's own
    fields, such as its cache folder, left out by :func:`~warmcache.runtime.snapshot.snapshot_document`)."""
    rows = [{**document["row"], **HOST_LOCAL} for _, document in sorted(indexes.items())]
    unsigned = canonical_bytes({"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, "records": rows})
    records = decode_snapshot(unsigned, source).records
    return json.dumps(snapshot_document(records, source, signing_key), indent=1, sort_keys=True).encode()


def host_architecture() -> str:
    """This machine's architecture as OCI names it (``amd64``, ``arm64``): a push compiles its code here."""
    return _ARCHITECTURES.get(platform.machine().lower(), platform.machine().lower())


def config_bytes(diff_ids: list[str], labels: dict[str, str], architecture: str) -> bytes:
    """The image config: the architecture its compiled code was built for (the pushing host's; a promoted image's
    own), Linux, and the layers' diff_ids (= digests: uncompressed)."""
    return canonical_bytes(
        {
            "architecture": architecture,
            "os": "linux",
            "config": {"Labels": labels},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
    )


def manifest_bytes(
    config: tuple[str, int], layers: list[Descriptor], metadata: Descriptor, annotations: dict[str, str]
) -> bytes:
    """The image manifest, in the one byte form whose sha256 is the tag's digest (the metadata layer last, marked for
    people)."""
    descriptors = [layer.as_json() for layer in layers] + [metadata.as_json({LAYER_ROLE: "metadata"})]
    return canonical_bytes(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config[0], "size": config[1]},
            "layers": descriptors,
            "annotations": annotations,
        }
    )


def _json(data: bytes, where: str, max_bytes: int) -> dict[str, Any]:
    if len(data) > max_bytes or json_nesting(data) > MAX_NESTING:
        raise CacheError(f"{where}: larger or deeper than warmcache writes; refused")
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise CacheError(f"{where}: not valid JSON ({exc}); refused") from None
    if not isinstance(value, dict):
        raise CacheError(f"{where}: not a JSON object; refused")
    return value


def _digest(descriptor: Any, where: str) -> str:
    """A descriptor's digest, refused unless ``sha256:`` and 64 hex digits (it becomes part of a request's path) with
    a byte count beside it."""
    digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
    size = descriptor.get("size") if isinstance(descriptor, dict) else None
    if not is_digest(digest) or isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise CacheError(f"{where}: descriptor {shown(descriptor)} has no sha256 digest and size; refused")
    assert isinstance(digest, str)
    return digest


def _indexes(index: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    indexes = index.get("indexes")
    if not isinstance(indexes, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in indexes.items()):
        raise CacheError(f"{where}: {INDEX_MEMBER} 'indexes' must map index keys to index documents; refused")
    return indexes


def _layers(index: dict[str, Any], where: str) -> tuple[Layer, ...]:
    try:
        return tuple(
            Layer(
                _digest(layer, where),
                layer["size"],
                tuple(BundleFile(str(path), str(sha), int(size)) for path, sha, size in layer["files"]),
            )
            for layer in index["layers"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CacheError(f"{where}: {INDEX_MEMBER} 'layers' is malformed ({exc}); refused") from None


def _superseded(index: dict[str, Any], where: str) -> tuple[Superseded, ...]:
    try:
        found = tuple(Superseded(str(digest), float(at)) for digest, at in index.get("superseded", []))
    except (TypeError, ValueError) as exc:
        raise CacheError(f"{where}: {INDEX_MEMBER} 'superseded' is malformed ({exc}); refused") from None
    bad = [s.digest for s in found if not is_digest(s.digest)]
    if bad:
        raise CacheError(f"{where}: {INDEX_MEMBER} 'superseded' names {shown(bad[0])}, not a sha256 digest; refused")
    return found
