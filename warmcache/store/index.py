"""The store's layout: content-addressed blobs and one index object per compiled shape.

::

    <prefix>/blobs/sha256/<first two hex>/<sha256>                  a cache file's bytes, stored once
    <prefix>/indexes/<model>/<toolchain hash>/<identity>.json      one compiled shape

An index is canonical JSON (sorted keys, no whitespace, UTF-8), produced by
:func:`index_bytes` alone, so the same shape pushed twice gives the same bytes
(a re-push writes nothing). ``push --sign`` adds a ``signature`` member over the canonical bytes of the rest
(:func:`warmcache.trust.sign_document`); ``pull`` checks it against trusted keys before believing the file list. It
carries the registry row (as a bundle does), the fingerprints and every file of the entries the shape needs with its
sha256 and size. A reader finds a shape's index by the identity it computes itself (shape × model config × toolchain),
so a host only ever sees indexes its own toolchain can load.

Every blob is written before the index that names it, and each object is written
atomically, so a reader never meets a half-written index nor one naming a blob
that is not there yet (``store gc`` leaves young unreferenced blobs alone for the
same reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warmcache.cache.layout import CacheFlavor
from warmcache.cache.locate import CacheLocation
from warmcache.errors import CacheError
from warmcache.registry import Registry, ShapeRecord
from warmcache.shipping.bundle import BundleFile, entries_needed, entry_files, sha256_of, shared_kernels
from warmcache.shipping.bundle_rows import check_rows, row_to_json
from warmcache.shipping.file_list import check_artifacts, check_files, read_signed_document
from warmcache.shipping.shipment import PushRequest
from warmcache.trust import NOT_CONFIGURED, SignatureCheck, TrustedKeys, canonical_bytes, sign_document

INDEX_FORMAT = 1
BLOB_PREFIX = "blobs/sha256/"
INDEX_PREFIX = "indexes/"
#: No real index comes near this; a larger object is refused before it is read.
MAX_INDEX_BYTES = 64 * 1024 * 1024


def blob_key(sha256: str) -> str:
    return f"{BLOB_PREFIX}{sha256[:2]}/{sha256}"


def index_key(model: str, toolchain_hash: str, identity: str) -> str:
    return f"{INDEX_PREFIX}{model}/{toolchain_hash}/{identity}.json"


@dataclass(frozen=True, slots=True)
class ShapeIndex:
    """A validated index: the shape's row, its cache layout and the files its entries hold."""

    key: str
    flavor: CacheFlavor
    row: dict[str, Any]
    files: dict[str, BundleFile]
    signature: SignatureCheck = SignatureCheck(checked=False, key_id=None)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())


def build_index(record: ShapeRecord, flavor: CacheFlavor, files: list[BundleFile]) -> dict[str, Any]:
    """The index of one compiled shape (deterministic: no push time, no pushing host)."""
    return {
        "format": INDEX_FORMAT,
        "identity": record.identity,
        "model": record.model_name,
        "flavor": flavor,
        "fingerprints": {"model_config": record.config_hash, "toolchain": record.toolchain_hash},
        "row": row_to_json(record),
        "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in sorted(files, key=lambda f: f.path)],
    }


@dataclass(frozen=True, slots=True)
class Outgoing:
    """What a push sends, whatever the store: its rows, each shape's files, and each shape's index by its key."""

    records: list[ShapeRecord]
    #: Declared shapes with no row to ship (what ``push`` says it left out).
    not_compiled: int
    files: dict[str, list[BundleFile]]
    #: Signed as a whole (the file list with every sha256 included) when the push signs.
    indexes: dict[str, dict[str, Any]]


def outgoing(request: PushRequest, registry: Registry) -> Outgoing:
    """The rows ``request`` ships, their files, and their indexes (signed with its key): what every store's push
    uploads or merges. Ed25519 signatures are deterministic: a signed re-push writes nothing new."""
    records, not_compiled = request.records(registry)
    location, key = request.scope.location, request.signing_key
    files = files_per_shape(records, location)
    indexes = {}
    for record in records:
        index = build_index(record, location.flavor, files[record.identity])
        indexes[index_key(record.model_name, record.toolchain_hash, record.identity)] = (
            sign_document(index, key) if key else index
        )
    return Outgoing(records, not_compiled, files, indexes)


def index_bytes(index: dict[str, Any]) -> bytes:
    """The one serialisation of an index: what is stored and compared (the signature covers the same canonical form)."""
    return canonical_bytes(index)


def parse_index(data: bytes, key: str, where: str, trusted: TrustedKeys = NOT_CONFIGURED) -> ShapeIndex:
    """Validate an index completely, or raise :class:`CacheError` naming the key and the fault.

    With ``trusted`` keys configured the signature is checked before anything the index
    says is believed (:class:`~warmcache.errors.TrustError` if it is missing, by another
    key or does not match); a ``signature`` member is accepted either way.
    """
    at = f"{where}/{key}"
    raw, signature, flavor = read_signed_document(data, at, "index", INDEX_FORMAT, trusted)
    [row] = check_rows([raw.get("row")], at)
    if (
        key != index_key(row["model_name"], row["toolchain_hash"], row["identity"])
        or raw.get("identity") != row["identity"]
    ):
        raise CacheError(
            f"{at}: its row is {row['model_name']} {row['identity']}, not the shape this key names; refused"
        )
    files = check_files(raw.get("files"), flavor, at)
    check_artifacts(row, files, flavor, f"{at}: row")
    return ShapeIndex(key, flavor, row, files, signature)


def files_per_shape(records: list[ShapeRecord], location: CacheLocation) -> dict[str, list[BundleFile]]:
    """Each shape's files (its entries plus the cache's kernel files), each file hashed once; a file that cannot be
    read is one line naming it, before anything is pushed."""
    try:
        return _files_per_shape(records, location)
    except OSError as exc:
        raise CacheError(f"{exc.filename or location.root}: {exc.strerror or exc}; nothing pushed") from None


def _files_per_shape(records: list[ShapeRecord], location: CacheLocation) -> dict[str, list[BundleFile]]:
    kernels = shared_kernels(location)
    hashed: dict[str, BundleFile] = {}

    def file(path: str) -> BundleFile:
        if path not in hashed:
            hashed[path] = BundleFile(path, sha256_of(location.root / path), (location.root / path).stat().st_size)
        return hashed[path]

    return {
        record.identity: [
            file(path) for path in entry_files(location.root, sorted(set(entries_needed([record], location)) | kernels))
        ]
        for record in records
    }
